"""The planner's clocks against the trained simulator's: same events, same times.

The per-layer round clock with ``layered=False`` is the round engine's clock,
and the event timeline is the event engine itself on a stand-in model: for every
strategy whose timing does not depend on the gradients' values, a trained run and
the planner agree round for round and event for event (the same events; the
same times to float32 rounding, one ulp).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxsync
from jaxsync._src.sim.layer_clock import LayerClock
from jaxsync.planning import VALUE_DEPENDENT, event_timeline
from jaxsync.strategies import blueprint, names

from sim_cases import problem

K = 4
# Slow workers, jitter and a latency: every term of the clock is exercised.
CLUSTER = dict(
  num_workers=K, compute_time=0.05, jitter_shape=20.0, slow_fraction=0.25, slowdown=2.0, link="1gbps"
)
SYNC_OPTIONS = {
  "allreduce": {},
  "bsp": {},
  "fastest_k": {"k": 3},
  "drop_worker": {},
  "hierarchical_allreduce": {"group_size": 2},
  "local_sgd": {"period": 4},
  "diloco": {"period": 4},
  "streaming_diloco": {"period": 4, "fragments": 2, "overlap": 1, "quantize": "int4"},
}
ASYNC = sorted(n for n in names() if blueprint(n, K).engine == "async" and n not in VALUE_DEPENDENT)
FAST_ASYNC = ("asp", "ssp", "async_local_sgd")


def _trained(name, options, events, time_model):
  loss, params, data = problem(K)
  strategy = jaxsync.strategies.make(name, K, **options)
  _, history = jaxsync.sim.run(strategy, loss, params, data, time_model, num_events=events, seed=3)
  return params, history


def test_every_synchronous_strategy_is_covered():
  synchronous = {n for n in names() if blueprint(n, K).engine == "sync"}
  assert synchronous == set(SYNC_OPTIONS)


@pytest.mark.parametrize("name", sorted(SYNC_OPTIONS))
def test_the_round_clock_is_the_round_engines_clock(name):
  options = SYNC_OPTIONS[name]
  time_model = jaxsync.sim.TimeModel(**CLUSTER)
  params, history = _trained(name, options, 10, time_model)
  sizes = [int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params)]
  clock = LayerClock(
    time_model.with_message_bytes(params), blueprint(name, K, **options), sizes, "float32", layered=False
  )
  times = clock.run([time_model.link], rounds=10, seed=3)
  np.testing.assert_allclose(times.ends[:, 0], history.time, rtol=2e-6)


def test_one_layer_per_layer_clock_is_the_round_clock():
  time_model = jaxsync.sim.TimeModel(**CLUSTER, message_bytes=10**6)
  for name in ("allreduce", "diloco"):
    layered, rounds = (
      LayerClock(
        time_model, blueprint(name, K, **SYNC_OPTIONS[name]), (250_000,), "float32", layered=flag
      ).run([time_model.link], rounds=6, seed=1)
      for flag in (True, False)
    )
    np.testing.assert_allclose(layered.ends, rounds.ends, rtol=1e-12)


def test_layers_hide_the_exchange_behind_the_backward_pass():
  """Data-parallel with 24 layers: all but the first layer's exchange runs under the backward pass."""
  time_model = jaxsync.sim.TimeModel(
    num_workers=2, compute_time=0.1, jitter_shape=None, link=jaxsync.sim.Link(0.0, 1e9)
  )
  sizes = (10**6,) * 24  # 24 layers of 4 MB: 4 ms each at 1 GB/s, 96 ms in all
  one = LayerClock(time_model, blueprint("allreduce", 2), sizes, "float32", layered=False).run(
    [time_model.link], 4
  )
  per_layer = LayerClock(time_model, blueprint("allreduce", 2), sizes, "float32").run([time_model.link], 4)
  np.testing.assert_allclose(np.diff(one.ends[:, 0]), 0.1 + 0.096, rtol=1e-7)
  # Layer 24's exchange starts after its backward (the forward's third plus 1/24 of the backward); the
  # 24 exchanges then queue back to back, longer than the rest of the backward: the step is
  # 0.1/3 + (2/3)(0.1)/24 + 0.096 = 0.1321 s.
  np.testing.assert_allclose(
    np.diff(per_layer.compute_ends[1:, 0]), 0.1 / 3 + 0.2 / 3 / 24 + 0.096, rtol=1e-7
  )


@pytest.mark.parametrize("name", FAST_ASYNC)
def test_the_event_timeline_is_the_event_engine(name):
  _assert_same_events(name)


@pytest.mark.heavy
@pytest.mark.parametrize("name", [n for n in ASYNC if n not in FAST_ASYNC])
def test_the_event_timeline_is_the_event_engine_for_every_asynchronous_strategy(name):
  _assert_same_events(name)


def _assert_same_events(name):
  time_model = jaxsync.sim.TimeModel(**CLUSTER)
  params, history = _trained(name, {}, 40, time_model)
  planned, _, _ = event_timeline(name, {}, time_model.with_message_bytes(params), 40, seed=3)
  for field in ("worker", "version", "released", "k", "staleness"):
    np.testing.assert_array_equal(getattr(planned, field), getattr(history, field), err_msg=field)
  # The same float32 sums, compiled in another program: XLA may fuse them differently (one ulp at most).
  np.testing.assert_allclose(planned.time, history.time, rtol=3e-7)


def test_adaptive_k_is_refused_with_what_to_plan_instead():
  with pytest.raises(ValueError, match="k_async"):
    jaxsync.plan(
      jaxsync.planning.ModelSize(parameters=1e6, layers=2, step_time=0.1),
      jaxsync.planning.Topology(workers=4, outer=jaxsync.sim.Link(0.0, 1e9)),
      [("adaptive k", "adaptive_k", {})],
    )


def test_only_adaptive_k_is_named_value_dependent():
  assert set(VALUE_DEPENDENT) == {"adaptive_k"}
