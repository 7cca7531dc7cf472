"""Every public rule, described once for the shared suite: how to build it, drive it, break it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax

import jaxsync

NUM_WORKERS = 4


@dataclasses.dataclass(frozen=True)
class RuleCase:
  """One public transform as the shared suite sees it.

  Attributes:
    name: test id.
    make: builds the transform as it would be used (direction rules chained
      with a learning rate).
    driver: "server" (K workers, round robin, asynchronous dispatch),
      "worker" (one worker, gradients at its own parameters) or "elastic"
      (K elastic workers around a centre).
    quadratic_lr: the learning rate of the quadratic convergence test.
    rosenbrock_lr: the learning rate of the Rosenbrock convergence test.
    versioned: a server rule with a version (read with ``jaxsync.server_version``).
    rosenbrock_steps: arrivals of the Rosenbrock test (a rule without momentum needs more).
    invalid: ``(factory, kwargs, argument name)`` that must raise ValueError.
  """

  name: str
  make: Callable[..., optax.GradientTransformationExtraArgs]
  driver: str
  quadratic_lr: float
  rosenbrock_lr: float
  versioned: bool = False
  invalid: tuple = ()
  rosenbrock_steps: int = 50_000


def _elastic_pair(worker_kwargs=None, center="easgd", lr=0.02):
  worker_kwargs = worker_kwargs or {}
  alpha = 0.9 / NUM_WORKERS
  worker = jaxsync.easgd_worker(lr, moving_rate=alpha, **worker_kwargs)
  center_rule = jaxsync.easgd_center(alpha) if center == "easgd" else jaxsync.ea_wild_center(alpha)
  return worker, center_rule


CASES = (
  RuleCase(
    "ordered_momentum",
    lambda lr=0.002: jaxsync.ordered_momentum(lr, 0.9, num_workers=NUM_WORKERS),
    "server",
    quadratic_lr=0.005,
    rosenbrock_lr=0.0001,
    versioned=True,
    invalid=(
      (jaxsync.ordered_momentum, dict(learning_rate=-0.1, num_workers=4), "learning_rate"),
      (jaxsync.ordered_momentum, dict(learning_rate=0.1, momentum=1.0, num_workers=4), "momentum"),
      (jaxsync.ordered_momentum, dict(learning_rate=0.1, num_workers=0), "num_workers"),
      (jaxsync.ordered_momentum, dict(learning_rate=0.1, num_workers=2.5), "num_workers"),
      (
        jaxsync.ordered_momentum,
        dict(learning_rate=0.1, num_workers=4, delay_measure="seconds"),
        "delay_measure",
      ),
      (
        jaxsync.ordered_momentum,
        dict(learning_rate=0.1, num_workers=4, delay_adaptive="yes"),
        "delay_adaptive",
      ),
    ),
  ),
  RuleCase(
    "ordered_momentum_da",
    lambda lr=0.002: jaxsync.ordered_momentum(lr, 0.9, num_workers=NUM_WORKERS, delay_adaptive=True),
    "server",
    quadratic_lr=0.005,
    rosenbrock_lr=0.0001,
    versioned=True,
  ),
  RuleCase(
    "adaptive_k",
    lambda lr=0.002: optax.chain(
      jaxsync.adaptive_k(momentum=0.9, max_k=NUM_WORKERS), optax.scale_by_learning_rate(lr)
    ),
    "server",
    quadratic_lr=0.005,
    rosenbrock_lr=5e-05,
    versioned=True,
    invalid=(
      (jaxsync.adaptive_k, dict(momentum=-0.1), "momentum"),
      (jaxsync.adaptive_k, dict(theta=0.0), "theta"),
      (jaxsync.adaptive_k, dict(theta=1.5), "theta"),
      (jaxsync.adaptive_k, dict(confidence=1.0), "confidence"),
      (jaxsync.adaptive_k, dict(ci_endpoint="middle"), "ci_endpoint"),
      (jaxsync.adaptive_k, dict(max_k=0), "max_k"),
    ),
  ),
  RuleCase(
    "on_release_adam",
    lambda lr=0.01: jaxsync.on_release(jaxsync.adaptive_k(momentum=0.0, max_k=NUM_WORKERS), optax.adam(lr)),
    "server",
    quadratic_lr=0.02,
    rosenbrock_lr=0.01,
    versioned=True,
  ),
  RuleCase(
    "scale_by_staleness",
    lambda lr=0.01: optax.chain(jaxsync.scale_by_staleness("linear"), optax.scale_by_learning_rate(lr)),
    "server",
    quadratic_lr=0.02,
    rosenbrock_lr=0.001,
    versioned=True,
    invalid=(
      (jaxsync.scale_by_staleness, dict(mode="quadratic"), "mode"),
      (jaxsync.scale_by_staleness, dict(mode="exponential", penalty=-1.0), "penalty"),
      (jaxsync.scale_by_staleness, dict(gradients_per_update=0), "gradients_per_update"),
    ),
  ),
  RuleCase(
    "scale_by_staleness_softsync",
    lambda lr=0.01: optax.chain(
      jaxsync.scale_by_staleness("exponential", penalty=0.1, gradients_per_update=2),
      optax.scale_by_learning_rate(lr),
    ),
    "server",
    quadratic_lr=0.02,
    rosenbrock_lr=0.0005,
    versioned=True,
  ),
  RuleCase(
    "smega2",
    lambda lr=0.002: jaxsync.smega2(lr, 0.9, num_workers=NUM_WORKERS),
    "server",
    quadratic_lr=0.005,
    rosenbrock_lr=0.0001,
    versioned=True,
    invalid=(
      (jaxsync.smega2, dict(learning_rate=0.0, num_workers=4), "learning_rate"),
      (jaxsync.smega2, dict(learning_rate=0.1, num_workers=-1), "num_workers"),
      (jaxsync.smega2, dict(learning_rate=0.1, num_workers=4, dampening=1.0), "dampening"),
      (jaxsync.smega2, dict(learning_rate=0.1, num_workers=4, look_ahead="far"), "look_ahead"),
    ),
  ),
  RuleCase(
    "dc_asgd",
    lambda lr=0.002: jaxsync.dc_asgd(lr, 0.04, num_workers=NUM_WORKERS),
    "server",
    quadratic_lr=0.005,
    rosenbrock_lr=0.0003,
    rosenbrock_steps=100_000,
    invalid=(
      (jaxsync.dc_asgd, dict(learning_rate=0.0, num_workers=4), "learning_rate"),
      (jaxsync.dc_asgd, dict(learning_rate=0.1, variance_control=-1.0, num_workers=4), "variance_control"),
      (jaxsync.dc_asgd, dict(learning_rate=0.1, num_workers=0), "num_workers"),
      (jaxsync.dc_asgd, dict(learning_rate=0.1, num_workers=4, adaptive=1), "adaptive"),
      (jaxsync.dc_asgd, dict(learning_rate=0.1, num_workers=4, mean_square_decay=1.0), "mean_square_decay"),
      (jaxsync.dc_asgd, dict(learning_rate=0.1, num_workers=4, eps=0.0), "eps"),
    ),
  ),
  RuleCase(
    "dc_asgd_adaptive",
    lambda lr=0.002: jaxsync.dc_asgd(lr, 2.0, num_workers=NUM_WORKERS, adaptive=True),
    "server",
    quadratic_lr=0.005,
    rosenbrock_lr=0.0003,
    rosenbrock_steps=100_000,
  ),
  RuleCase(
    "delayed_nesterov",
    lambda lr=0.002: jaxsync.delayed_nesterov(lr, 0.9, momentum_period=NUM_WORKERS),
    "server",
    quadratic_lr=0.005,
    rosenbrock_lr=0.0003,
    rosenbrock_steps=100_000,
    invalid=(
      (jaxsync.delayed_nesterov, dict(learning_rate=-1.0, momentum_period=4), "learning_rate"),
      (jaxsync.delayed_nesterov, dict(learning_rate=0.1, momentum=1.0, momentum_period=4), "momentum"),
      (jaxsync.delayed_nesterov, dict(learning_rate=0.1, momentum_period=0), "momentum_period"),
      (jaxsync.delayed_nesterov, dict(learning_rate=0.1, momentum_period=4, activation=0.5), "activation"),
    ),
  ),
  RuleCase(
    "diloco",
    lambda lr=0.002: jaxsync.diloco(optax.sgd(lr), period=4),
    "worker",
    quadratic_lr=0.005,
    rosenbrock_lr=0.0001,
    invalid=(
      (jaxsync.diloco, dict(inner=optax.sgd(0.1), period=0), "period"),
      (jaxsync.diloco, dict(inner="adamw", period=4), "inner"),
      (jaxsync.diloco, dict(inner=optax.sgd(0.1), outer=0.7, period=4), "outer"),
    ),
  ),
  RuleCase(
    "bb_step_size",
    lambda lr=0.002: optax.chain(jaxsync.bb_step_size(lr, smoothing=0.1), optax.scale(-1.0)),
    "worker",
    quadratic_lr=0.005,
    rosenbrock_lr=0.0001,
    invalid=(
      (jaxsync.bb_step_size, dict(initial_step_size=0.0, smoothing=0.5), "initial_step_size"),
      (jaxsync.bb_step_size, dict(initial_step_size=0.1, smoothing=0.0), "smoothing"),
      (jaxsync.bb_step_size, dict(initial_step_size=0.1, smoothing=float("nan")), "smoothing"),
      (jaxsync.bb_step_size, dict(initial_step_size=0.1, smoothing=0.5, armijo_shrink=1.0), "armijo_shrink"),
      (jaxsync.bb_step_size, dict(initial_step_size=0.1, smoothing=0.5, max_backtracks=-1), "max_backtracks"),
    ),
  ),
  RuleCase(
    "easgd_worker",
    lambda lr=0.002: _elastic_pair(lr=lr)[0],
    "elastic",
    quadratic_lr=0.02,
    rosenbrock_lr=0.001,
    invalid=(
      (jaxsync.easgd_worker, dict(learning_rate=0.1, moving_rate=1.5), "moving_rate"),
      (jaxsync.easgd_worker, dict(learning_rate=0.1, moving_rate=0.1, period=0), "period"),
      (jaxsync.easgd_worker, dict(learning_rate=0.1, moving_rate=0.1, momentum=1.0), "momentum"),
    ),
  ),
  RuleCase(
    "eamsgd_worker",
    lambda lr=0.002: _elastic_pair({"momentum": 0.9, "period": 4}, lr=lr)[0],
    "elastic",
    quadratic_lr=0.02,
    rosenbrock_lr=0.0003,
  ),
  RuleCase(
    "easgd_center",
    lambda lr=0.002: _elastic_pair(lr=lr)[1],
    "elastic",
    quadratic_lr=0.02,
    rosenbrock_lr=0.001,
    invalid=((jaxsync.easgd_center, dict(moving_rate=-0.1), "moving_rate"),),
  ),
  RuleCase(
    "ea_wild_center",
    lambda lr=0.002: _elastic_pair(center="wild", lr=lr)[1],
    "elastic",
    quadratic_lr=0.02,
    rosenbrock_lr=0.001,
    invalid=((jaxsync.ea_wild_center, dict(moving_rate=2.0), "moving_rate"),),
  ),
)


def case_by_name(name: str) -> RuleCase:
  return next(c for c in CASES if c.name == name)


def run_server(case: RuleCase, tx, loss: Callable, x0: jax.Array, steps: int):
  """K workers, round robin, asynchronous dispatch: each arrival gets the new parameters.

  Each worker holds the point it must compute its gradient at (the look-ahead
  for SMEGA²) and its version. Returns the server parameters after ``steps``.
  """
  grad = jax.grad(loss)

  def current_version(state, t):
    # A rule that counts no versions (DC-ASGD) is sent the arrivals applied so far.
    version = jaxsync.server_version(state) if case.versioned else None
    return jnp.asarray(t + 1, jnp.int32) if version is None else version

  def body(carry, t):
    w, state, points, versions = carry
    i = t % NUM_WORKERS
    g = grad(points[i])
    u, state = tx.update(g, state, w, worker=i, version=versions[i], num_live_workers=jnp.int32(NUM_WORKERS))
    w = optax.apply_updates(w, u)
    points = points.at[i].set(jaxsync.look_ahead(w, state))
    versions = versions.at[i].set(current_version(state, t))
    return (w, state, points, versions), None

  state = tx.init(x0)
  points = jnp.broadcast_to(x0, (NUM_WORKERS,) + x0.shape)
  versions = jnp.zeros(NUM_WORKERS, jnp.int32)
  (w, state, _, _), _ = jax.lax.scan(body, (x0, state, points, versions), jnp.arange(steps))
  return w, state


def run_worker(case: RuleCase, tx, loss: Callable, x0: jax.Array, steps: int):
  grad = jax.grad(loss)

  def body(carry, _):
    x, state = carry
    # value_fn enables Armijo backtracking in bb_step_size; other rules ignore it.
    u, state = tx.update(grad(x), state, x, value_fn=loss)
    return (optax.apply_updates(x, u), state), None

  (x, state), _ = jax.lax.scan(body, (x0, tx.init(x0)), None, length=steps)
  return x, state


def run_elastic(case: RuleCase, tx, loss: Callable, x0: jax.Array, steps: int, lr: float):
  """K elastic workers in round robin around a centre; the tested rule is one side.

  Returns the centre, which must converge to the optimum.
  """
  grad = jax.grad(loss)
  if case.name in ("easgd_center", "ea_wild_center"):
    worker, center_rule = _elastic_pair(lr=lr)[0], tx
  else:
    worker, center_rule = tx, jaxsync.easgd_center(0.9 / NUM_WORKERS)
  wild = case.name == "ea_wild_center"

  def body(carry, t):
    center, center_state, xs, worker_states, reads = carry
    i = t % NUM_WORKERS
    x = xs[i]
    wstate = jax.tree.map(lambda s: s[i], worker_states)
    # EA-wild reads the centre lock-free: the copy read at the worker's last turn.
    read = reads[i] if wild else center
    u, wstate = worker.update(grad(jaxsync.look_ahead(x, wstate)), wstate, x, center=read)
    e, new_center_state = center_rule.update(x, center_state, center, center_read=read)
    center = jnp.where(wstate.exchanged, optax.apply_updates(center, e), center)
    center_state = jax.tree.map(
      lambda new, old: jnp.where(wstate.exchanged, new, old), new_center_state, center_state
    )
    xs = xs.at[i].set(optax.apply_updates(x, u))
    worker_states = jax.tree.map(lambda s, n: s.at[i].set(n), worker_states, wstate)
    reads = reads.at[i].set(center)
    return (center, center_state, xs, worker_states, reads), None

  xs = jnp.stack([x0 * (1.0 + 0.1 * k) for k in range(NUM_WORKERS)])
  worker_states = jax.vmap(worker.init)(xs)
  carry = (x0, center_rule.init(x0), xs, worker_states, jnp.broadcast_to(x0, xs.shape))
  (center, center_state, _, _, _), _ = jax.lax.scan(body, carry, jnp.arange(steps))
  return center, center_state


DRIVERS = {"server": run_server, "worker": run_worker, "elastic": run_elastic}


def run_case(case: RuleCase, loss: Callable, x0: jax.Array, steps: int, lr: float):
  """Runs ``case`` with learning rate ``lr`` for ``steps`` arrivals, compiled as one scan."""
  tx = case.make(lr=lr)
  driver = DRIVERS[case.driver]
  if case.driver == "elastic":
    return jax.jit(lambda x: driver(case, tx, loss, x, steps, lr))(x0)
  return jax.jit(lambda x: driver(case, tx, loss, x, steps))(x0)


def extra_args_for(case: RuleCase, state: Any, params: Any) -> dict:
  """Valid extra args for one update of ``case`` on ``params`` (for single-step tests)."""
  if case.driver == "server":
    return {
      "worker": jnp.int32(1),
      "version": jaxsync.server_version(state),
      "num_live_workers": jnp.int32(NUM_WORKERS),
    }
  if case.driver == "elastic":
    return {"center": params, "center_read": params}
  return {}
