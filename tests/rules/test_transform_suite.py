"""The shared suite: every public rule through the same checks (issue 2, "A shared suite")."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import quadratic, rosenbrock
from rule_cases import CASES, extra_args_for, run_case

CASE_IDS = [c.name for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_converges_on_a_quadratic(case):
  loss, _ = quadratic(np.linspace(1.0, 10.0, 10))
  x0 = jnp.ones(10)
  x, _ = run_case(case, loss, x0, 2000, case.quadratic_lr)
  assert float(loss(x)) < 1e-4 * float(loss(x0)), float(loss(x))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_converges_on_rosenbrock(case):
  x0 = jnp.array([-1.2, 1.0])
  x, _ = run_case(case, rosenbrock, x0, case.rosenbrock_steps, case.rosenbrock_lr)
  assert float(rosenbrock(x)) < 1e-3, (float(rosenbrock(x)), np.asarray(x))
  np.testing.assert_allclose(x, [1.0, 1.0], atol=0.1)


def _params(dtype):
  return {"w": jnp.linspace(-1.0, 1.0, 6, dtype=dtype).reshape(2, 3), "b": jnp.ones(3, dtype)}


def _grads(dtype, scale=0.5):
  return {"w": jnp.full((2, 3), scale, dtype), "b": jnp.linspace(0.1, 0.3, 3, dtype=dtype)}


def _traced_update(case):
  """The rule's update under jit, counting how often jax traces it."""
  tx = case.make()
  traces = []

  @jax.jit
  def update(grads, state, params):
    traces.append(1)
    return tx.update(grads, state, params, **extra_args_for(case, state, params))

  return tx, update, traces


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_no_recompilation_on_the_second_call(case):
  tx, update, traces = _traced_update(case)
  params = _params(jnp.float32)
  state = tx.init(params)
  for scale in (0.5, -0.25, 0.125):
    updates, state = update(_grads(jnp.float32, scale), state, params)
    params = optax.apply_updates(params, updates)
  assert len(traces) == 1


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_state_buffers_can_be_donated_with_the_params(case):
  """No state buffer aliases the params or another state buffer: a step that donates
  both (as the runtimes and the benchmark do) must run, twice."""
  tx = case.make()

  @functools.partial(jax.jit, donate_argnums=(1, 2))
  def step(grads, state, params):
    updates, state = tx.update(grads, state, params, **extra_args_for(case, state, params))
    return optax.apply_updates(params, updates), state

  params = _params(jnp.float32)
  state = tx.init(params)
  for _ in range(2):
    params, state = step(_grads(jnp.float32), state, params)
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(params))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_dtypes_are_stable(case, dtype):
  tx, update, traces = _traced_update(case)
  params = _params(dtype)
  state = tx.init(params)
  init_dtypes = jax.tree.map(lambda x: jnp.asarray(x).dtype, state)
  for _ in range(3):
    updates, state = update(_grads(dtype), state, params)
    params = optax.apply_updates(params, updates)
  assert jax.tree.map(lambda x: x.dtype, updates) == {"w": dtype, "b": dtype}
  assert jax.tree.map(lambda x: x.dtype, params) == {"w": dtype, "b": dtype}
  assert jax.tree.map(lambda x: jnp.asarray(x).dtype, state) == init_dtypes
  assert len(traces) == 1
  assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(updates))


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_unknown_extra_args_are_ignored(case):
  tx = case.make()
  params = _params(jnp.float32)
  state = tx.init(params)
  extra = extra_args_for(case, state, params)
  expected, _ = tx.update(_grads(jnp.float32), state, params, **extra)
  # ``worker`` is an extra arg some server rules read (DC-ASGD); the others must ignore it.
  unknown = {"learning_phase": "warmup"} if "worker" in extra else {"learning_phase": "warmup", "worker": 3}
  got, _ = tx.update(_grads(jnp.float32), state, params, **extra, **unknown)
  jax.tree.map(np.testing.assert_array_equal, got, expected)


INVALID = [(c.name, factory, kwargs, arg) for c in CASES for factory, kwargs, arg in c.invalid]


@pytest.mark.parametrize(
  "name,factory,kwargs,arg", INVALID, ids=[f"{n}-{a}-{i}" for i, (n, _, _, a) in enumerate(INVALID)]
)
def test_invalid_hyperparameters_are_rejected_by_name_and_value(name, factory, kwargs, arg):
  with pytest.raises(ValueError) as error:
    factory(**kwargs)
  message = str(error.value)
  assert f"{arg}={kwargs[arg]!r}" in message or f"{arg}={float(kwargs[arg])!r}" in message, message
  assert "expected" in message and factory.__name__ in message


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_nonfinite_gradients_are_rejected_counted_and_forgotten(case, bad):
  """A NaN/Inf arrival: exact zeros out, state unchanged but for the counter (and the
  per-arrival flags, which say it released or exchanged nothing), and the next valid arrival gives what it would have given had the bad one never come."""
  tx, update, _ = _traced_update(case)
  params = _params(jnp.float32)
  state = tx.init(params)
  updates, state = update(_grads(jnp.float32), state, params)  # a first, valid arrival
  params = optax.apply_updates(params, updates)

  poisoned = _grads(jnp.float32)
  poisoned["w"] = poisoned["w"].at[1, 2].set(bad)
  out, after_bad = update(poisoned, state, params)
  jax.tree.map(lambda x: np.testing.assert_array_equal(x, 0.0), out)
  count = optax.tree.get(state, "nonfinite_count")
  assert int(optax.tree.get(after_bad, "nonfinite_count")) == int(count) + 1
  expected_state = optax.tree.set(state, nonfinite_count=count + 1)
  for flag in ("released", "exchanged"):  # per-arrival flags: a rejected arrival did neither
    if optax.tree.get(state, flag) is not None:
      expected_state = optax.tree.set(expected_state, **{flag: jnp.asarray(False)})
  jax.tree.map(np.testing.assert_array_equal, after_bad, expected_state)

  good = _grads(jnp.float32, scale=-0.3)
  expected, _ = update(good, state, params)
  got, _ = update(good, after_bad, params)
  jax.tree.map(np.testing.assert_array_equal, got, expected)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_grads_finite_flag_replaces_the_scan(case):
  """A caller that already checked the gradient passes grads_finite: False rejects
  (and counts) a finite-looking arrival, True gives exactly the self-checked result."""
  tx, update, _ = _traced_update(case)
  params = _params(jnp.float32)
  state = tx.init(params)
  extra = extra_args_for(case, state, params)
  expected, expected_state = tx.update(_grads(jnp.float32), state, params, **extra)
  got, got_state = tx.update(_grads(jnp.float32), state, params, **extra, grads_finite=jnp.bool_(True))
  jax.tree.map(np.testing.assert_array_equal, (got, got_state), (expected, expected_state))
  out, flagged = tx.update(_grads(jnp.float32), state, params, **extra, grads_finite=jnp.bool_(False))
  jax.tree.map(lambda x: np.testing.assert_array_equal(x, 0.0), out)
  assert int(optax.tree.get(flagged, "nonfinite_count")) == 1
