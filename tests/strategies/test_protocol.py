"""The papers' training protocol on every strategy: schedules on their clocks, coupled L2 weight decay."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsync
from jaxsync._src.strategies.schedules import learning_rate_schedule, steps_per_epoch

from sim_cases import problem

K = 4
STOP = 4  # the schedule's clock step from which the rate is 0

# Options that make the rate the only thing moving the parameters it applies (no momentum carrying
# earlier updates on, no elastic pull); the strategy's own ones otherwise.
STILL = {
  "bsp": {"momentum": 0.0},
  "allreduce": {"momentum": 0.0},
  "hierarchical_allreduce": {"momentum": 0.0},
  "fastest_k": {"momentum": 0.0},
  "drop_worker": {"momentum": 0.0},
  "naive_asgdm": {"momentum": 0.0},
  "shifted_momentum": {"momentum": 0.0},
  "smega2": {"momentum": 0.0},
  "ormo": {"momentum": 0.0},
  "ormo_da": {"momentum": 0.0},
  "adaptive_k": {"momentum": 0.0},
  "local_sgd": {"period": 2},
  "diloco": {"period": 2, "outer_momentum": 0.0},
  # Mixing keeps a worker's own fragment apart from theta, whose difference the outer step moves by.
  "streaming_diloco": {"period": 4, "outer_momentum": 0.0, "mixing": 0.0},
  "async_local_sgd": {"period": 2, "outer_momentum": 0.0},
  "easgd": {"moving_rate": 0.0, "period": 1},
  "eamsgd": {"moving_rate": 0.0, "period": 1, "momentum": 0.0},
  "ea_wild": {"moving_rate": 0.0},
  "inhad": {"local_workers": 2},
}


def _stop_after(steps):
  return lambda t: jnp.where(jnp.asarray(t) < steps, 0.05, 0.0)


def _event_by_event(strategy, events):
  """Runs ``events`` events one at a time; returns the states before and after each.

  The parameters hold ``d``, which the loss ignores: only weight decay moves it.
  """
  loss, params, data = problem(K)
  params = {**params, "d": jnp.full([2], 2.0)}
  sim = jaxsync.sim.Simulator(strategy, loss, data, jaxsync.sim.TimeModel(num_workers=K))
  state = sim.init(params, 0)
  states = [jax.tree.map(np.asarray, state)]
  for _ in range(events):
    state, _ = sim.advance(state, 1)
    states.append(jax.tree.map(np.asarray, state))
  return states


def _counters(state):
  """(server version, each worker's steps, the workers' own models) of an EventState or a RoundState."""
  if isinstance(state, jaxsync.sim.EventState):
    return state.server.version, state.workers.steps, state.workers.params
  return state.version, state.steps, state.worker_params


def _moved(a, b) -> bool:
  return any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


@pytest.mark.parametrize("name", jaxsync.strategies.names())
def test_the_schedule_counts_the_strategys_own_clock_and_weight_decay_is_applied(name):
  """One run per strategy: the rate drops to 0 after STOP steps of its clock, and weight decay (scaled by
  the rate, as coupled L2 is) shrinks a parameter no gradient reaches while the rate is on."""
  options = {**STILL.get(name, {}), "learning_rate": _stop_after(STOP), "weight_decay": 0.5}
  if name == "adaptive_k":
    options["max_k"] = 2
  strategy = jaxsync.strategies.make(name, K, **options)
  states = _event_by_event(strategy, 10 if strategy.engine == "sync" else 28)
  clock = strategy.rate_clock
  elastic = strategy.protocol == "elastic"
  moved_while_running, moved_after = False, False
  for before, after in zip(states, states[1:]):
    (version, steps, models), (_, steps_after, models_after) = _counters(before), _counters(after)
    if clock == "server_updates":
      # The rate of the update from server version v is rate(v): updates from version >= STOP move nothing.
      moved = _moved(before.params, after.params)
      late = int(version) >= STOP
    elif elastic:
      # A worker's own model moves by its own rate, counted on its own steps.
      worker = int(np.argmax(steps_after - steps))
      moved = _moved(models, models_after)
      late = int(steps[worker]) >= STOP
    elif strategy.protocol == "local":
      moved = _moved(before.params, after.params)
      # Every worker's local steps that this round's pseudo-gradient spans are past STOP: a fragment's
      # (Streaming DiLoCo) spans the rounds since its last sync.
      spans = (strategy.exchange.fragments - 1) * strategy.local_steps
      late = int(steps.min()) - spans >= STOP
    else:  # BB: each worker scales its own gradient by its rate, counted on its own steps
      worker = int(np.argmax(steps_after - steps))
      moved = _moved(before.params, after.params)
      late = int(steps[worker]) >= STOP
    moved_while_running |= moved and not late
    moved_after |= moved and late
  assert moved_while_running, f"{name}: nothing moved before the rate went to 0"
  assert not moved_after, f"{name}: the parameters moved after {STOP} steps of its {clock} clock"
  decayed = _counters(states[-1])[2]["d"] if elastic else states[-1].params["d"]
  assert np.all(np.abs(decayed) < 2.0 - 1e-4), f"{name}: weight decay did not shrink d: {decayed}"


def test_smega2s_decay_is_the_servers_and_eamsgds_is_at_its_look_ahead_point():
  w = jnp.array([1.0, -2.0])
  rule = jaxsync.strategies.make("smega2", 1, learning_rate=0.1, momentum=0.5, weight_decay=0.2).server_rule
  u, _ = rule.update(jnp.zeros(2), rule.init(w), w)
  np.testing.assert_allclose(u, -0.1 * 0.2 * w, rtol=1e-6)  # g + lambda w, w the server's
  worker = jaxsync.easgd_worker(0.1, moving_rate=0.0, momentum=0.5, weight_decay=0.2)
  state = worker.init(w)
  _, state = worker.update(jnp.ones(2), state, w, center=w)  # v = -0.1 (1 + 0.2 w)
  v = -0.1 * (1 + 0.2 * w)
  u, _ = worker.update(jnp.zeros(2), state, w + v, center=w)
  point = (w + v) + 0.5 * v  # x + delta v
  np.testing.assert_allclose(u, 0.5 * v - 0.1 * 0.2 * point, rtol=1e-6)


def test_smega2s_reply_uses_the_applied_arrivals_rate():
  schedule = lambda t: 0.1 * (jnp.asarray(t, jnp.float32) + 1.0)  # 0.1, 0.2, ...
  rule = jaxsync.smega2(schedule, 0.5, num_workers=2)
  state = rule.init(jnp.zeros(2))
  _, state = rule.update(jnp.ones(2), state, jnp.zeros(2))  # the arrival with count 0: rate 0.1
  # a = eta beta (N - c + c beta) with c = 1: 0.1 * 0.5 * (2 - 1 + 0.5), the applied arrival's eta (not 0.2).
  assert float(state.look_ahead_momentum_scale) == pytest.approx(0.1 * 0.5 * 1.5)


def test_the_schedule_shapes_and_epochs_on_each_clock():
  s = learning_rate_schedule(0.1, kind="cosine", warmup_steps=10, warmup_from=0.1, decay_steps=100, end=0.01)
  values = [float(s(t)) for t in (0, 5, 10, 60, 110, 500)]
  np.testing.assert_allclose(values, [0.01, 0.055, 0.1, 0.1 * (0.01 + 0.99 * 0.5), 0.001, 0.001], rtol=1e-5)
  with pytest.raises(ValueError, match="boundaries=.*increasing"):
    learning_rate_schedule(0.1, kind="step", boundaries=[5, 2])
  with pytest.raises(ValueError, match="decay_steps=None"):
    learning_rate_schedule(0.1, kind="cosine")
  make = jaxsync.strategies.make
  assert steps_per_epoch(make("asp", 8), num_examples=6400, batch_size=32) == 200  # an update per gradient
  assert steps_per_epoch(make("bsp", 8), num_examples=6400, batch_size=32) == 25  # K gradients per round
  assert steps_per_epoch(make("k_async", 8, k=4), num_examples=6400, batch_size=32) == 50
  assert steps_per_epoch(make("easgd", 8), num_examples=6400, batch_size=32) == 25  # each worker's steps
  with pytest.raises(ValueError, match="varying number of gradients"):
    steps_per_epoch(make("adaptive_k", 8), num_examples=6400, batch_size=32)
