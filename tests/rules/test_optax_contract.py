"""The ecosystem's transform contract: every public rule where optax's own transforms go, optax.sgd as control.

Each check is one thing a user of optax relies on without thinking: a
transform inside ``optax.masked``, ``multi_transform``, ``MultiSteps``,
``apply_if_finite``, ``chain`` and ``vmap``; gradients of another dtype than
the parameters; trees with no leaves, ``None`` leaves or scalars; the state's
layout read with ``optax.tree_map_params``. ``optax.sgd`` with momentum runs
every check as the control: a check it failed would be testing optax, not us.
Checks a rule cannot meet are listed in ``KNOWN_LIMITS`` with the reason (also
in the Transforms guide); the test then asserts that the rule still fails, so
the list cannot go stale.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsync

from rule_cases import CASES, RuleCase, extra_args_for, run_case

CONTROL = RuleCase("optax_sgd", lambda lr=0.002: optax.sgd(lr, momentum=0.9), "worker", 0.005, 0.0001)
# Streaming DiLoCo: two fragments (one per leaf of the checks' parameters), overlap, mixing, int8 on the wire.
STREAMING = RuleCase(
  "streaming_diloco",
  lambda lr=0.002: jaxsync.diloco(
    optax.sgd(lr), period=4, fragments=2, overlap=1, mixing=0.5, quantize="int8"
  ),
  "worker",
  0.005,
  0.0001,
)
ALL = (CONTROL, *CASES, STREAMING)
IDS = [c.name for c in ALL]

# (check, rule): what the rule raises instead, and why (the Transforms guide lists them too).
KNOWN_LIMITS = {
  # Streaming DiLoCo cuts the parameter arrays it sees into P fragments: it needs at least P of them, and an
  # empty tree, a wrapper that hands it one array, or optax.tree_map_params (whose init sees no arrays) has fewer.
  ("no_leaves", "streaming_diloco"): "fragments=2 is invalid; .* the model has 0 parameter arrays",
  ("masked", "streaming_diloco"): "fragments=2 is invalid; .* the model has 1 parameter arrays",
  ("multi_transform", "streaming_diloco"): "fragments=2 is invalid; .* the model has 1 parameter arrays",
  ("tree_map_params", "streaming_diloco"): "fragments=2 is invalid; .* the model has 0 parameter arrays",
}


def _unless_a_known_limit(check: str, case: RuleCase):
  """The check's body must pass, or, for a listed limit, raise what the list says (so the list cannot go stale)."""
  limit = KNOWN_LIMITS.get((check, case.name))
  return pytest.raises(ValueError, match=limit) if limit else contextlib.nullcontext()


def _params(dtype=jnp.float32):
  return {"w": jnp.linspace(-1.0, 1.0, 6, dtype=dtype).reshape(2, 3), "b": jnp.ones(5, dtype)}


def _grads(params, scale=0.5):
  return jax.tree.map(
    lambda p: (scale * jnp.cos(jnp.arange(p.size).reshape(p.shape))).astype(p.dtype), params
  )


def _steps(tx, case, params, grads_dtype=None, steps=3, jit=True):
  """``steps`` updates of ``tx`` (the case's extra args at each), the last updates and the final state."""

  def step(grads, state, params):
    return tx.update(grads, state, params, **extra_args_for(case, state, params))

  step = jax.jit(step) if jit else step
  state = tx.init(params)
  for i in range(steps):
    grads = _grads(params, 0.5 - 0.3 * i)
    if grads_dtype is not None:
      grads = jax.tree.map(lambda g: g.astype(grads_dtype), grads)
    updates, state = step(grads, state, params)
    params = optax.apply_updates(params, updates)
  return params, updates, state


def _finite(tree):
  return all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize(
  "params_dtype,grads_dtype",
  [(jnp.float32, jnp.bfloat16), (jnp.bfloat16, jnp.float32), (jnp.float16, jnp.float32)],
  ids=["f32-params-bf16-grads", "bf16-params-f32-grads", "f16-params-f32-grads"],
)
@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_gradients_of_another_dtype_than_the_parameters(case, params_dtype, grads_dtype):
  """The update runs and the parameters keep their dtype; the state's dtypes settle after the first update (optax's
  own trace takes the gradients' dtype there) and then hold, so a jitted loop compiles at most twice. (A learning
  rate large enough that three steps move bfloat16 parameters near 1.)"""
  tx = case.make(0.05)
  params = _params(params_dtype)
  _, _, first = _steps(tx, case, params, grads_dtype, steps=1)
  new_params, updates, state = _steps(tx, case, params, grads_dtype)
  assert jax.tree.map(lambda x: x.dtype, new_params) == {"w": params_dtype, "b": params_dtype}
  dtypes = lambda tree: jax.tree.map(lambda x: jnp.asarray(x).dtype, tree)  # noqa: E731
  assert dtypes(state) == dtypes(first)
  assert _finite(updates) and _finite(new_params)
  assert not np.allclose(np.asarray(new_params["w"], np.float32), np.asarray(params["w"], np.float32))


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_float16_parameters_keep_their_dtype(case):
  tx = case.make()
  params = _params(jnp.float16)
  init_dtypes = jax.tree.map(lambda x: jnp.asarray(x).dtype, tx.init(params))
  new_params, updates, state = _steps(tx, case, params)
  assert jax.tree.map(lambda x: x.dtype, updates) == {"w": jnp.float16, "b": jnp.float16}
  assert jax.tree.map(lambda x: jnp.asarray(x).dtype, state) == init_dtypes
  assert _finite(new_params)


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_a_tree_with_no_leaves(case):
  with _unless_a_known_limit("no_leaves", case):
    tx = case.make()
    _, updates, state = _steps(tx, case, {}, steps=2)
    assert updates == {}
    assert jax.tree.leaves(state) is not None


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_none_leaves_and_scalar_parameters(case):
  """A ``None`` leaf (a layer without bias) is no array: it stays ``None``; a scalar trains as any array (after
  four arrivals, which every buffering rule of the suite releases)."""
  tx = case.make()
  params = {"w": jnp.ones((2, 2)), "bias": None, "scale": jnp.float32(1.5)}
  state = tx.init(params)
  grads = {"w": jnp.full((2, 2), 0.5), "bias": None, "scale": jnp.float32(0.25)}
  step = jax.jit(lambda g, s, p: tx.update(g, s, p, **extra_args_for(case, s, p)))
  for _ in range(4):
    updates, state = step(grads, state, params)
    params = optax.apply_updates(params, updates)
    assert updates["bias"] is None and params["bias"] is None
  assert updates["scale"].shape == ()
  assert float(params["scale"]) != 1.5


def _reference(case, params, steps=3):
  """The rule alone on ``params``: what each wrapper must reproduce on the leaves it passes to the rule."""
  return _steps(case.make(), case, params, steps=steps)


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_inside_optax_masked_with_its_defaults(case):
  """The masked leaf passes through; the others get the rule's own updates (as if the leaf did not exist)."""
  with _unless_a_known_limit("masked", case):
    params = _params()
    tx = optax.masked(case.make(), {"w": True, "b": False})
    new_params, updates, _ = _steps(tx, case, params)
    alone, _, _ = _reference(case, {"w": params["w"]})
    np.testing.assert_allclose(new_params["w"], alone["w"], rtol=1e-6)
    # optax.masked hands a masked-out leaf its input unchanged: b moves by the sum of its gradients.
    expected_b = params["b"] + sum(_grads(params, 0.5 - 0.3 * i)["b"] for i in range(3))
    np.testing.assert_allclose(new_params["b"], expected_b, rtol=1e-6)


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_inside_optax_multi_transform_with_its_defaults(case):
  with _unless_a_known_limit("multi_transform", case):
    params = _params()
    tx = optax.multi_transform(
      {"rule": case.make(), "frozen": optax.set_to_zero()}, {"w": "rule", "b": "frozen"}
    )
    new_params, _, _ = _steps(tx, case, params)
    alone, _, _ = _reference(case, {"w": params["w"]})
    np.testing.assert_allclose(new_params["w"], alone["w"], rtol=1e-6)
    np.testing.assert_array_equal(new_params["b"], params["b"])


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_after_a_clip_in_optax_chain(case):
  params = _params()
  tx = optax.chain(optax.clip_by_global_norm(1e9), case.make())  # a clip that never clips: the rule's updates
  new_params, _, _ = _steps(tx, case, params)
  alone, _, _ = _reference(case, params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), new_params, alone)


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_inside_optax_multisteps(case):
  """Two micro-batches per step: the rule sees their mean once, and the parameters move every second call."""
  params = _params()
  tx = optax.MultiSteps(case.make(), every_k_schedule=2)
  state = tx.init(params)
  moved = []
  for _ in range(4):
    updates, state = tx.update(
      _grads(params, 0.5), state, params, **extra_args_for(case, state.inner_opt_state, params)
    )
    params = optax.apply_updates(params, updates)
    moved.append(any(bool(jnp.any(u != 0)) for u in jax.tree.leaves(updates)))
  assert moved[0] is False and moved[2] is False and any(moved)
  assert _finite(params)


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_inside_optax_apply_if_finite(case):
  params = _params()
  tx = optax.apply_if_finite(case.make(), max_consecutive_errors=3)
  state = tx.init(params)
  bad = jax.tree.map(lambda g: g.at[0].set(jnp.nan), _grads(params))
  updates, state = tx.update(bad, state, params, **extra_args_for(case, state.inner_state, params))
  assert int(state.notfinite_count) == 1
  jax.tree.map(lambda u: np.testing.assert_array_equal(u, 0.0), updates)
  updates, state = tx.update(_grads(params), state, params, **extra_args_for(case, state.inner_state, params))
  assert int(state.notfinite_count) == 0 and _finite(updates)


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_under_vmap_every_lane_is_the_rule_alone(case):
  """Three independent copies (one per lane), as a population or per-worker state would hold them."""
  tx = case.make()
  lanes = jax.tree.map(lambda p: jnp.stack([p, 2 * p, -p]), _params())

  def run(params):
    return _steps(tx, case, params, jit=False)[0]

  batched = jax.jit(jax.vmap(run))(lanes)
  for lane in range(3):
    alone = run(jax.tree.map(lambda x, i=lane: x[i], lanes))
    got = jax.tree.map(lambda x, i=lane: x[i], batched)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), got, alone)


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_tree_map_params_reaches_every_parameter_shaped_buffer(case):
  """``optax.tree_map_params`` maps every state leaf that follows a parameter (the way a user gives the state its
  shardings) and leaves the rest; per-worker stacks keep their leading axis."""
  with _unless_a_known_limit("tree_map_params", case):
    tx = case.make()
    params = _params()
    state = tx.init(params)
    mapped = optax.tree_map_params(
      tx,
      lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=None),
      state,
      transform_non_params=lambda x: x,
    )
    leaves = jax.tree.leaves(mapped)
    param_like = [x for x in leaves if isinstance(x, jax.ShapeDtypeStruct)]

    def follows_a_parameter(shape):  # a parameter's shape, or a stack of them on a leading per-worker axis
      return tuple(shape) in ((2, 3), (5,)) or (len(shape) in (2, 3) and tuple(shape[1:]) in ((2, 3), (5,)))

    assert all(follows_a_parameter(x.shape) for x in param_like), [x.shape for x in param_like]
    buffers = [x for x in jax.tree.leaves(state) if follows_a_parameter(jnp.shape(x))]
    assert len(param_like) == len(buffers), (len(param_like), len(buffers))


# The optax rule of each rule's family, at the same learning rate: what bfloat16 parameters cost it is the margin.
MOMENTUM_FAMILY = {
  "ordered_momentum",
  "ordered_momentum_da",
  "adaptive_k",
  "smega2",
  "delayed_nesterov",
  "eamsgd_worker",
}
CURVATURES = jnp.linspace(1.0, 10.0, 10)
OPTIMUM = jnp.linspace(0.5, 1.5, 10)  # off zero, where bfloat16's spacing (2^-8 to 2^-7) limits every rule


def _off_centre_loss(x):
  return 0.5 * jnp.sum(CURVATURES * (x.astype(jnp.float32) - OPTIMUM) ** 2)


def _control_for(case: RuleCase) -> RuleCase:
  if case.name == "on_release_adam":
    make = optax.adam
  elif case.name in MOMENTUM_FAMILY:
    make = lambda lr: optax.sgd(lr, momentum=0.9)  # noqa: E731
  else:
    make = optax.sgd
  return RuleCase(f"control_of_{case.name}", lambda lr=0.002: make(lr), "worker", case.quadratic_lr, 0.0)


def _bf16_loss(case: RuleCase) -> float:
  x, _ = run_case(case, _off_centre_loss, jnp.zeros(10, jnp.bfloat16), 2000, case.quadratic_lr)
  assert x.dtype == jnp.bfloat16
  return float(_off_centre_loss(x))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bfloat16_parameters_converge_within_the_optax_controls_margin(case):
  """On bfloat16 parameters the updates that fall under half the parameters' spacing are rounded away: every rule,
  as its optax control at the same rate, stops short of the optimum. A rule ends within 10x its control's loss
  there (its state, in float32, costs nothing more) and at under 1% of where it started."""
  start = float(_off_centre_loss(jnp.zeros(10)))
  rule, control = _bf16_loss(case), _bf16_loss(_control_for(case))
  assert rule < 1e-2 * start, (rule, start)
  assert rule <= 10.0 * control, (rule, control)


def test_diloco_keeps_its_anchor_in_float32_for_bfloat16_parameters():
  """The pseudo-gradient ``theta - x`` is a small difference of nearby values: a bfloat16 anchor rounds part of it
  away (and ends 2.8x higher here); the float32 default ends below the inner optimizer alone."""

  def diloco_case(dtype):
    return RuleCase(
      "d", lambda lr=0.05: jaxsync.diloco(optax.sgd(lr), period=4, accumulator_dtype=dtype), "worker", 0.05, 0
    )

  state = jaxsync.diloco(optax.sgd(0.05), period=4).init(jnp.zeros(10, jnp.bfloat16))
  assert state.anchor.dtype == jnp.float32 and state.outer_state[0].trace.dtype == jnp.float32
  default, bf16 = _bf16_loss(diloco_case(None)), _bf16_loss(diloco_case(jnp.bfloat16))
  inner_alone = _bf16_loss(RuleCase("sgd", lambda lr=0.05: optax.sgd(lr), "worker", 0.05, 0))
  assert default < 0.5 * bf16, (default, bf16)
  assert default < inner_alone, (default, inner_alone)


@pytest.mark.parametrize("wrapper", ["masked", "multi_transform"])
@pytest.mark.parametrize("name", ["smega2", "eamsgd_worker"])
def test_look_ahead_reads_a_masked_state(name, wrapper):
  """``jaxsync.look_ahead`` through ``optax.masked`` / ``multi_transform``: the rule's look-ahead point on the leaves
  it trains, the parameters on the others."""
  case = next(c for c in CASES if c.name == name)
  params = _params()
  if wrapper == "masked":
    tx = optax.masked(case.make(0.05), {"w": True, "b": False})
  else:
    tx = optax.multi_transform({"rule": case.make(0.05), "sgd": optax.sgd(0.1)}, {"w": "rule", "b": "sgd"})
  moved, _, state = _steps(tx, case, params)
  alone_params, _, alone_state = _steps(case.make(0.05), case, {"w": params["w"]})
  point = jaxsync.look_ahead(moved, state)
  expected = jaxsync.look_ahead(alone_params, alone_state)["w"]
  assert not np.allclose(expected, alone_params["w"])  # the rule does look ahead here
  np.testing.assert_allclose(point["w"], expected, rtol=1e-6)
  np.testing.assert_array_equal(point["b"], moved["b"])


# Every rule with a parameter-sized buffer, the fields that hold one, and a valid update's extra args.
ACCUMULATORS = {
  "ordered_momentum": (
    lambda dt: jaxsync.ordered_momentum(0.1, num_workers=4, accumulator_dtype=dt),
    ["momentum_buffer"],
  ),
  "adaptive_k": (
    lambda dt: jaxsync.adaptive_k(max_k=4, accumulator_dtype=dt),
    ["fresh_mean", "stale_sum", "momentum_buffer"],
  ),
  "smega2": (
    lambda dt: jaxsync.smega2(0.1, num_workers=4, accumulator_dtype=dt),
    ["momentum_buffer", "accumulator"],
  ),
  "delayed_nesterov": (
    lambda dt: jaxsync.delayed_nesterov(0.1, momentum_period=4, accumulator_dtype=dt),
    ["momentum_buffer", "buffer"],
  ),
  "easgd_worker": (
    lambda dt: jaxsync.easgd_worker(0.1, moving_rate=0.2, momentum=0.5, accumulator_dtype=dt),
    ["velocity"],
  ),
  "dc_asgd": (
    lambda dt: jaxsync.dc_asgd(0.1, 2.0, num_workers=4, adaptive=True, accumulator_dtype=dt),
    ["mean_square"],
  ),
  "bb_step_size": (lambda dt: jaxsync.bb_step_size(0.1, smoothing=0.5, accumulator_dtype=dt), ["prev_grads"]),
  "scale_by_staleness": (
    lambda dt: jaxsync.scale_by_staleness(gradients_per_update=2, accumulator_dtype=dt),
    ["accumulated"],
  ),
  "diloco": (
    lambda dt: jaxsync.diloco(optax.sgd(0.1), period=4, fragments=2, overlap=1, accumulator_dtype=dt),
    ["anchor", "pending"],
  ),
}


@pytest.mark.parametrize("name", ACCUMULATORS)
def test_accumulator_dtype_sets_the_state_buffers_dtype_as_optax_does(name):
  """``accumulator_dtype`` (optax's name): ``None`` keeps at least float32 (bfloat16 parameters get float32
  buffers), a dtype is kept as given, through updates; anything but a floating dtype is refused by name."""
  make, fields = ACCUMULATORS[name]
  case = RuleCase(name, None, "elastic" if name == "easgd_worker" else "server", 0.0, 0.0)
  for params_dtype, accumulator_dtype, expected in [
    (jnp.bfloat16, None, jnp.float32),
    (jnp.float32, None, jnp.float32),
    (jnp.bfloat16, jnp.bfloat16, jnp.bfloat16),
    (jnp.float32, "bfloat16", jnp.bfloat16),
  ]:
    tx = make(accumulator_dtype)
    _, updates, state = _steps(tx, case, _params(params_dtype))
    for field in fields:
      leaves = jax.tree.leaves(optax.tree.get(state, field))
      assert leaves and all(x.dtype == expected for x in leaves), (field, params_dtype, accumulator_dtype)
    assert all(u.dtype == params_dtype for u in jax.tree.leaves(updates))
  with pytest.raises(
    ValueError, match=r"accumulator_dtype='int32' is invalid; expected None .* a floating dtype"
  ):
    make("int32")


# A centre's "gradient" is a worker's model: it has no place as a model's own optimizer.
MODEL_OPTIMIZERS = [c for c in ALL if c.name not in ("easgd_center", "ea_wild_center")]


@pytest.mark.parametrize("case", MODEL_OPTIMIZERS, ids=[c.name for c in MODEL_OPTIMIZERS])
def test_as_a_flax_nnx_optimizer(case):
  """``nnx.Optimizer(model, rule, wrt=nnx.Param)`` under ``nnx.jit``: extra args through ``update``, the loss falls."""
  from flax import nnx

  model = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, case.make(0.05), wrt=nnx.Param)
  x = jnp.linspace(-1.0, 1.0, 12).reshape(4, 3)

  @nnx.jit
  def step(model, optimizer):
    loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - 1.0) ** 2))(model)
    extra = {"worker": jnp.int32(0)} if case.driver == "server" else {}
    if case.driver == "elastic":
      extra = {"center": nnx.as_pure(nnx.state(model, nnx.Param))}
    optimizer.update(model, grads, **extra)
    return loss

  losses = [float(step(model, optimizer)) for _ in range(12)]
  assert losses[-1] < 0.9 * losses[0], losses


COMPLEX_OPTIMUM = {
  "a": jnp.array([1.0 + 2.0j, -1.0 + 0.5j], jnp.complex64),
  "b": jnp.array([0.25 - 1.0j], jnp.complex64),
}


@pytest.mark.parametrize("case", MODEL_OPTIMIZERS, ids=[c.name for c in MODEL_OPTIMIZERS])
def test_complex_parameters_train_as_optax_does(case):
  """Complex parameters, with the conjugated gradient optax's complex support takes (``jax.grad`` of a real loss
  gives the conjugate of the ascent direction): the state keeps a complex dtype and the loss falls to 1%."""
  tx = case.make(0.02)

  def loss(z):
    return sum(jnp.sum(jnp.abs(z[k] - COMPLEX_OPTIMUM[k]) ** 2) for k in z)

  @jax.jit
  def step(z, state):
    grads = jax.tree.map(jnp.conj, jax.grad(loss)(z))
    updates, state = tx.update(grads, state, z, **extra_args_for(case, state, z), value_fn=loss)
    return optax.apply_updates(z, updates), state

  zero = jax.tree.map(jnp.zeros_like, COMPLEX_OPTIMUM)
  z, state = zero, tx.init(zero)
  for _ in range(400):
    z, state = step(z, state)
  assert all(x.dtype == jnp.complex64 for x in jax.tree.leaves(z))
  assert float(loss(z)) < 1e-2 * float(loss(zero)), float(loss(z))


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_float64_parameters_under_x64_keep_their_dtype(case):
  """With ``jax_enable_x64``: float64 updates for float64 parameters, and a state whose dtypes hold through
  updates (the step size of ``bb_step_size`` once became float64 after its first)."""
  with jax.enable_x64(True):
    tx = case.make()
    params = _params(jnp.float64)
    dtypes = lambda tree: jax.tree.map(lambda x: jnp.asarray(x).dtype, tree)  # noqa: E731
    init = dtypes(tx.init(params))
    new_params, updates, state = _steps(tx, case, params)
    assert jax.tree.map(lambda x: x.dtype, updates) == {"w": jnp.float64, "b": jnp.float64}
    assert dtypes(state) == init
    assert _finite(new_params)
