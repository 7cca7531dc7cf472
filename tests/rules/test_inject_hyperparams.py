"""Every public rule under ``optax.inject_hyperparams``: arrays and tracers accepted, the same updates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxsync

X0 = jnp.array([1.0, -2.0, 0.5])
CURVATURE = jnp.array([1.0, 3.0, 0.5])

# (factory, keyword arguments, static_args, how the rule is driven)
CASES = {
  "ordered_momentum": (
    jaxsync.ordered_momentum,
    dict(learning_rate=0.05, momentum=0.9, num_workers=4),
    (),
    "server",
  ),
  "ordered_momentum_da": (
    jaxsync.ordered_momentum,
    dict(learning_rate=0.05, momentum=0.9, num_workers=4, delay_adaptive=True),
    (),
    "server",
  ),
  "smega2": (
    jaxsync.smega2,
    dict(learning_rate=0.05, momentum=0.9, num_workers=4, dampening=0.1),
    (),
    "server",
  ),
  "adaptive_k": (jaxsync.adaptive_k, dict(momentum=0.9, theta=0.5, confidence=0.9, max_k=3), (), "server"),
  "adaptive_k_lower": (
    jaxsync.adaptive_k,
    dict(momentum=0.9, theta=0.5, confidence=0.9, max_k=3, ci_endpoint="lower"),
    ("confidence", "max_k"),
    "server",
  ),
  "scale_by_staleness": (
    jaxsync.scale_by_staleness,
    dict(mode="exponential", penalty=0.3, gradients_per_update=2),
    ("gradients_per_update",),
    "server",
  ),
  "bb_step_size": (
    jaxsync.bb_step_size,
    dict(initial_step_size=0.05, smoothing=0.5, max_scale=3.0, armijo_slope=0.2, max_backtracks=5),
    (),
    "worker",
  ),
  "easgd_worker": (
    jaxsync.easgd_worker,
    dict(learning_rate=0.1, moving_rate=0.2, period=2, momentum=0.5),
    (),
    "elastic_worker",
  ),
  "dc_asgd": (
    jaxsync.dc_asgd,
    dict(learning_rate=0.05, variance_control=0.5, num_workers=2),
    ("num_workers",),
    "plain_server",
  ),
  "dc_asgd_adaptive": (
    jaxsync.dc_asgd,
    dict(learning_rate=0.05, variance_control=2.0, num_workers=2, adaptive=True, mean_square_decay=0.9),
    ("num_workers", "adaptive"),
    "plain_server",
  ),
  "delayed_nesterov": (
    jaxsync.delayed_nesterov,
    dict(learning_rate=0.05, momentum=0.9, momentum_period=3, activation=0.1),
    ("momentum_period",),
    "plain_server",
  ),
  "diloco": (
    lambda period, mixing: jaxsync.diloco(optax.sgd(0.1), optax.sgd(0.5), period=period, mixing=mixing),
    dict(period=3, mixing=0.25),
    (),
    "plain_server",
  ),
  "streaming_diloco": (
    lambda period, mixing, fragments, overlap, quantize_block: jaxsync.diloco(
      optax.sgd(0.1),
      period=period,
      mixing=mixing,
      fragments=fragments,
      overlap=overlap,
      quantize="int8",
      quantize_block=quantize_block,
    ),
    dict(period=4, mixing=0.25, fragments=1, overlap=1, quantize_block=2),  # one leaf: one fragment
    ("fragments", "overlap", "quantize_block"),
    "plain_server",
  ),
  "easgd_center": (jaxsync.easgd_center, dict(moving_rate=0.2), (), "center"),
  "ea_wild_center": (jaxsync.ea_wild_center, dict(moving_rate=0.2), (), "center"),
}


def _extra(kind, state, x):
  if kind == "server":
    return {
      "version": jaxsync.server_version(state) - (jaxsync.server_version(state) > 0),
      "num_live_workers": 4,
    }
  if kind == "plain_server":  # a server rule that counts no versions (DC-ASGD reads the worker)
    return {"worker": 1}
  if kind == "worker":
    return {"noise_ratio": jnp.float32(0.1), "value_fn": lambda p: 0.5 * jnp.sum(CURVATURE * p * p)}
  if kind == "elastic_worker":
    return {"center": jnp.zeros_like(x)}
  return {"center_read": 0.5 * x}


def _run(tx, kind, steps=8):
  """``steps`` jitted updates on a quadratic; returns the updates and the final state."""

  @jax.jit
  def step(x, state):
    grads = CURVATURE * x if kind != "center" else x + 1.0  # a centre takes a worker's model
    updates, state = tx.update(grads, state, x, **_extra(kind, state, x))
    return optax.apply_updates(x, updates), state, updates

  x, state, out = X0, tx.init(X0), []
  for _ in range(steps):
    x, state, updates = step(x, state)
    out.append(np.asarray(updates))
  return np.stack(out), state


@pytest.mark.parametrize("name", CASES)
def test_injected_hyperparameters_give_the_plain_rules_updates(name):
  factory, kwargs, static, kind = CASES[name]
  plain, _ = _run(factory(**kwargs), kind)
  injected_tx = optax.inject_hyperparams(factory, static_args=static)(**kwargs)
  injected, state = _run(injected_tx, kind)
  np.testing.assert_allclose(injected, plain, rtol=1e-5, atol=1e-7)
  assert np.abs(plain).sum() > 0  # the rule did move
  for key in set(kwargs) - set(static) - {"mode", "ci_endpoint", "delay_adaptive"}:
    assert key in state.hyperparams, key  # injected, i.e. traced inside the jitted update


@pytest.mark.parametrize("name", CASES)
def test_optax_tree_get_and_set_address_an_injected_hyperparameter_as_for_optax(name):
  """No state field shares a hyperparameter's name: ``optax.tree.get(state, h)`` reads the hyperparameter and
  ``optax.tree.set(state, h=v)`` changes it and nothing else (it once replaced a momentum buffer)."""
  factory, kwargs, static, kind = CASES[name]
  tx = optax.inject_hyperparams(factory, static_args=static)(**kwargs)
  _, state = _run(tx, kind, steps=3)
  for key in state.hyperparams:
    np.testing.assert_array_equal(optax.tree.get(state, key), state.hyperparams[key])
    changed = optax.tree.set(state, **{key: state.hyperparams[key] * 0.5})
    np.testing.assert_array_equal(changed.hyperparams[key], state.hyperparams[key] * 0.5)
    rest = lambda s, k=key: (s.inner_state, {h: v for h, v in s.hyperparams.items() if h != k})  # noqa: E731
    jax.tree.map(np.testing.assert_array_equal, rest(changed), rest(state))


def test_renamed_state_fields_are_still_readable_with_a_deprecation_warning():
  state = jaxsync.ordered_momentum(0.1, num_workers=2).init(X0)
  with pytest.warns(DeprecationWarning, match="OrderedMomentumState.momentum was renamed momentum_buffer"):
    np.testing.assert_array_equal(state.momentum, state.momentum_buffer)
  worker = jaxsync.easgd_worker(0.1, moving_rate=0.2, momentum=0.5).init(X0)
  with pytest.warns(DeprecationWarning, match="look_ahead_scale"):
    assert float(worker.momentum) == 0.5
  for state_class in (jaxsync.AdaptiveKState, jaxsync.Smega2State, jaxsync.DelayedNesterovState):
    assert "momentum" not in state_class._fields and "momentum_buffer" in state_class._fields


def test_an_injected_learning_rate_can_be_changed_between_updates():
  tx = optax.inject_hyperparams(jaxsync.ordered_momentum)(learning_rate=0.05, momentum=0.0, num_workers=1)
  state = tx.init(X0)
  u1, state = tx.update(jnp.ones(3), state, X0, version=0)
  state.hyperparams["learning_rate"] = jnp.asarray(0.5)
  u2, state = tx.update(jnp.ones(3), state, X0, version=1)
  np.testing.assert_allclose(u1, -0.05)
  np.testing.assert_allclose(u2, -0.5)


def test_arrays_pass_unchecked_but_python_numbers_and_shapes_are_still_checked():
  jaxsync.ordered_momentum(jnp.asarray(0.05), momentum=jnp.asarray(0.9), num_workers=jnp.asarray(4))
  with pytest.raises(ValueError, match="momentum=1.5"):
    jaxsync.ordered_momentum(0.05, momentum=1.5, num_workers=4)
  with pytest.raises(ValueError, match=r"momentum='<array of shape \(2,\)>' is invalid; expected a scalar"):
    jaxsync.ordered_momentum(0.05, momentum=jnp.zeros(2), num_workers=4)
  with pytest.raises(ValueError, match="gradients_per_update=.*static_args"):
    optax.inject_hyperparams(jaxsync.scale_by_staleness)(gradients_per_update=2).init(X0)
  with pytest.raises(ValueError, match="confidence=.*ci_endpoint='lower'"):
    jaxsync.adaptive_k(confidence=jnp.asarray(0.9), ci_endpoint="lower")


@pytest.mark.parametrize("name", ["fragments", "overlap", "quantize_block"])
def test_diloco_names_static_args_for_what_decides_its_structure(name):
  # DiLoCo's period and mixing are tuned as arrays; these three shape its state and say how to pass them.
  kwargs = dict(period=4, fragments=2, overlap=1, quantize="int8", quantize_block=2)
  kwargs[name] = jnp.asarray(kwargs[name])
  with pytest.raises(ValueError, match=f"list '{name}' in static_args"):
    jaxsync.diloco(optax.sgd(0.1), **kwargs)


# The table of docs/guide/transforms.md, checked row by row: (factory, every argument with a value, extras).
TABLE_CASES = {
  "ordered_momentum": (
    jaxsync.ordered_momentum,
    dict(learning_rate=0.05, momentum=0.9, num_workers=4, delay_adaptive=True, delay_measure="groups"),
    "server",
  ),
  "adaptive_k": (
    jaxsync.adaptive_k,
    dict(momentum=0.9, theta=0.5, confidence=0.9, max_k=3, fresh_staleness=1, ci_endpoint="lower"),
    "server",
  ),
  "bb_step_size": (
    jaxsync.bb_step_size,
    dict(
      initial_step_size=0.05,
      smoothing=0.5,
      armijo_slope=0.2,
      armijo_shrink=0.5,
      max_backtracks=5,
      max_scale=3.0,
      server_momentum=0.5,
      armijo=True,
    ),
    "worker",
  ),
  "scale_by_staleness": (
    jaxsync.scale_by_staleness,
    dict(mode="exponential", penalty=0.3, gradients_per_update=2),
    "server",
  ),
  "smega2": (
    jaxsync.smega2,
    dict(learning_rate=0.05, momentum=0.9, num_workers=4, dampening=0.1, look_ahead="naive"),
    "server",
  ),
  "easgd_worker": (
    jaxsync.easgd_worker,
    dict(learning_rate=0.1, moving_rate=0.2, period=2, momentum=0.5, weight_decay=0.01),
    "elastic_worker",
  ),
  "easgd_center": (jaxsync.easgd_center, dict(moving_rate=0.2), "center"),
  "ea_wild_center": (jaxsync.ea_wild_center, dict(moving_rate=0.2), "center"),
  "dc_asgd": (
    jaxsync.dc_asgd,
    dict(
      learning_rate=0.05, variance_control=2.0, num_workers=2, mean_square_decay=0.9, eps=1e-6, adaptive=True
    ),
    "plain_server",
  ),
  "delayed_nesterov": (
    jaxsync.delayed_nesterov,
    dict(learning_rate=0.05, momentum=0.9, momentum_period=3, activation=0.1),
    "plain_server",
  ),
  "diloco": (
    jaxsync.diloco,
    dict(
      inner=optax.sgd(0.1), period=4, mixing=0.25, fragments=1, overlap=1, quantize="int8", quantize_block=2
    ),
    "plain_server",
  ),
}


def _table():
  """{rule: (tuned, static, left alone)} from the transforms page's inject_hyperparams table."""
  import pathlib
  import re

  page = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "guide" / "transforms.md").read_text()
  section = page[page.index("## Tuning hyperparameters with `optax.inject_hyperparams`") :]
  rows = {}
  for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 4 or not cells[0].startswith("`"):
      continue
    names = [lambda c=c: re.findall(r"`(\w+)`", c) for c in cells]
    for rule in names[0]():
      rows[rule] = tuple(set(n()) for n in names[1:])
  return rows


def test_the_transforms_page_table_has_a_row_for_every_rule_of_the_suite():
  assert set(_table()) == set(TABLE_CASES)


@pytest.mark.parametrize("rule", sorted(TABLE_CASES))
def test_the_transforms_page_says_which_arguments_inject_hyperparams_can_tune(rule):
  factory, kwargs, kind = TABLE_CASES[rule]
  tuned, static, _ = _table()[rule]
  static = static & set(kwargs)  # "confidence, max_k with ci_endpoint='lower'": the case sets it
  plain, _ = _run(factory(**kwargs), kind)
  injected, state = _run(optax.inject_hyperparams(factory, static_args=tuple(static))(**kwargs), kind)
  np.testing.assert_allclose(injected, plain, rtol=1e-5, atol=1e-7)
  assert tuned - static <= set(state.hyperparams), tuned - set(state.hyperparams)
  assert not set(state.hyperparams) & static
  for name in static:  # each static argument, given as a number and not listed, is refused with the hint
    with pytest.raises(ValueError, match=f"list '{name}' in static_args"):
      optax.inject_hyperparams(factory, static_args=tuple(static - {name}))(**kwargs).init(X0)


def test_structure_arguments_left_at_their_defaults_need_no_static_args():
  # The design card's use: nothing in static_args. Their defaults are None, which inject_hyperparams skips.
  tx = optax.inject_hyperparams(jaxsync.diloco)(optax.sgd(0.1), period=3)
  _, state = _run(tx, "plain_server")
  assert set(state.hyperparams) == {"period", "mixing"}
  _, state = _run(
    optax.inject_hyperparams(jaxsync.scale_by_staleness)(mode="exponential", penalty=0.5), "server"
  )
  assert set(state.hyperparams) == {"penalty"}
