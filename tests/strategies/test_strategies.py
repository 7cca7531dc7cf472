"""The strategy registry: names, options, defaults, and clear errors before anything compiles."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import pytest

import jaxsync

from sim_cases import problem

REQUIRED = (
  "bsp allreduce hierarchical_allreduce asp naive_asgdm shifted_momentum smega2 ormo ormo_da ssp "
  "fastest_k drop_worker k_async adaptive_k staleness_aware_asp easgd eamsgd ea_wild hogwild inhad local_sgd"
).split()


def test_registry_has_every_strategy_of_the_issue_with_a_summary():
  assert set(REQUIRED) <= set(jaxsync.strategies.names())
  for name in jaxsync.strategies.names():
    info = jaxsync.strategies.describe(name)
    assert info.summary and (info.summary.endswith(")") or info.summary.endswith(".")), info.summary
    # A summary cites a paper by name and venue, not our internal notes.
    assert not re.search(r"[Ss]eed 00\d|spec §", info.summary), info.summary
    strategy = jaxsync.strategies.make(name, 8)
    assert strategy.name == name and strategy.num_workers == 8
    assert dict(strategy.options) == dict(info.options)
    assert set(info.meanings) == set(info.options) and all(info.meanings.values())


def test_an_option_without_a_meaning_is_caught():
  from jaxsync._src.strategies import registry

  with pytest.raises(KeyError):
    registry.option_meaning("asp", "an_option_nobody_documented")
  # A strategy's own meaning of a shared name wins over the shared one.
  assert registry.option_meaning("k_async", "k") != registry.option_meaning("fastest_k", "k")


FAMILIES = ("synchronous", "hierarchical", "parameter_server", "low_communication", "elastic")


def test_every_strategy_lives_in_its_family_and_the_registry_holds_none():
  # The registry is the table and its lookups; each factory sits in its family's module, so adding a
  # strategy touches that module only.
  import inspect

  from jaxsync._src.strategies import registry, table

  homes = {table.REGISTRY[name].factory.__module__.rsplit(".", 1)[1] for name in registry.names()}
  assert homes == set(FAMILIES), homes
  assert not [
    n
    for n, f in inspect.getmembers(registry, inspect.isfunction)
    if f.__module__ == registry.__name__
    and "num_workers" in inspect.signature(f).parameters
    and n not in ("blueprint", "make", "_recipe")
  ]
  assert {
    table.REGISTRY[n].factory.__module__.rsplit(".", 1)[1] for n in ("ormo", "diloco", "inhad", "ea_wild")
  } == {"parameter_server", "low_communication", "hierarchical", "elastic"}


def test_a_strategy_registered_in_a_family_is_found_with_its_own_meanings(monkeypatch):
  from jaxsync._src.strategies import registry, table
  from jaxsync._src.strategies.parameter_server import pieces

  monkeypatch.setattr(table, "REGISTRY", dict(table.REGISTRY))
  monkeypatch.setattr(registry, "REGISTRY", table.REGISTRY)
  monkeypatch.setattr(table, "_STRATEGY_MEANINGS", dict(table._STRATEGY_MEANINGS))

  @table.register("plain_asgd_for_a_test", learning_rate=0.02, meanings={"noise": "how loud it is"})
  def _plain(num_workers, *, noise=0.5, weight_decay=0.0):
    """A test's strategy (Nobody, 2026)."""
    blueprint = pieces.asynchronous("plain_asgd_for_a_test", num_workers)
    return table.Recipe(blueprint, lambda lr: (pieces.sgd(lr), None))

  info = registry.describe("plain_asgd_for_a_test")
  assert info.options == {"learning_rate": 0.02, "noise": 0.5, "weight_decay": 0.0}
  assert info.meanings["noise"] == "how loud it is"
  assert registry.make("plain_asgd_for_a_test", 3).num_workers == 3


@pytest.mark.parametrize(
  ("call", "hint"),
  [
    (lambda: jaxsync.strategies.make("ormoo", 4), "did you mean 'ormo'?"),
    (lambda: jaxsync.strategies.make("Streaming-DiLoCo", 4), "did you mean 'streaming_diloco'?"),
    (lambda: jaxsync.strategies.make("ormo", 4, momentom=0.5), "did you mean 'momentum'?"),
    (lambda: jaxsync.strategies.make("asp", 4, server_optimizer="adamw"), "did you mean 'adam'?"),
  ],
)
def test_a_misspelt_name_or_option_gets_a_suggestion(call, hint):
  with pytest.raises(ValueError, match=re.escape(hint)):
    call()


def test_paper_defaults():
  assert jaxsync.strategies.make("ssp", 8).staleness_bound == 3
  assert jaxsync.strategies.make("drop_worker", 32).gradients_per_round == 16  # 50% drop rate
  assert jaxsync.strategies.make("fastest_k", 32, drop_rate=0.25).gradients_per_round == 24
  assert jaxsync.strategies.make("easgd", 6).options["moving_rate"] is None  # resolved as 0.9 / p
  adaptive = jaxsync.strategies.make("adaptive_k", 8, bb_step_size=True)
  assert isinstance(adaptive.worker_rule.init(jnp.zeros(2)), jaxsync.BBStepSizeState)
  assert jaxsync.strategies.make("inhad", 8).node_size == 4


def test_easgd_default_moving_rate_is_point_nine_over_p():
  strategy = jaxsync.strategies.make("easgd", 6, period=1)
  x, centre = jnp.array([1.0]), jnp.array([0.0])
  update, _ = strategy.server_rule.update(x, strategy.server_rule.init(centre), centre)
  np.testing.assert_allclose(update, [0.15], rtol=1e-6)


@pytest.mark.parametrize(
  ("call", "words"),
  [
    (lambda: jaxsync.strategies.make("nope", 4), ["name='nope'", "asp", "ormo"]),
    (
      lambda: jaxsync.strategies.make("asp", 4, momentum=0.9),
      ["unknown option(s) momentum", "learning_rate"],
    ),
    (lambda: jaxsync.strategies.make("fastest_k", 4, k=5), ["k=5", "num_workers=4"]),
    (lambda: jaxsync.strategies.make("k_async", 4, k=5), ["k=5", "num_workers=4"]),
    (lambda: jaxsync.strategies.make("ssp", 4, staleness_bound=-1), ["staleness_bound=-1", ">= 0"]),
    (lambda: jaxsync.strategies.make("asp", 0), ["num_workers=0", ">= 1"]),
    (lambda: jaxsync.strategies.make("asp", 4, learning_rate=-0.1), ["learning_rate=-0.1"]),
    (lambda: jaxsync.strategies.make("inhad", 6, local_workers=4), ["local_workers=4", "divisor"]),
    (lambda: jaxsync.strategies.make("adaptive_k", 4, max_k=9), ["max_k=9"]),
    (lambda: jaxsync.strategies.make("adaptive_k", 4, armijo=True), ["armijo=True", "bb_step_size"]),
    (lambda: jaxsync.strategies.make("ormo_da", 4, delay_measure="x"), ["delay_measure='x'"]),
    (lambda: jaxsync.sim.TimeModel(num_workers=0), ["num_workers=0"]),
    (lambda: jaxsync.sim.TimeModel(num_workers=4, link="2gbps"), ["'2gbps'", "100gbps"]),
    (lambda: jaxsync.sim.Link(latency=1e-6, bandwidth=0.0), ["bandwidth=0.0", "(0.0, inf]"]),
    (lambda: jaxsync.sim.Link(latency=-1.0, bandwidth=1e9), ["latency=-1.0"]),
    (lambda: jaxsync.sim.TimeModel(num_workers=4, slowdown=0.5), ["slowdown=0.5"]),
    (lambda: jaxsync.sim.TimeModel(num_workers=2, compute_times=[1.0]), ["compute_times"]),
    (
      lambda: jaxsync.sim.WorkerData({"x": np.zeros(10)}, num_workers=4, batch_size=3),
      ["batch_size=3", "shard"],
    ),
  ],
)
def test_invalid_options_raise_a_clear_error(call, words):
  with pytest.raises(ValueError) as err:
    call()
  for word in words:
    assert word in str(err.value), (word, str(err.value))


def test_simulator_rejects_mismatched_parts_before_compiling():
  loss, params, data = problem(4)
  strategy = jaxsync.strategies.make("asp", 4)
  with pytest.raises(ValueError, match="time_model.num_workers=8"):
    jaxsync.sim.Simulator(strategy, loss, data, jaxsync.sim.TimeModel(num_workers=8))
  with pytest.raises(ValueError, match="exactly one"):
    jaxsync.sim.Simulator(strategy, loss, data, jaxsync.sim.TimeModel(num_workers=4), eval_fn=lambda p: {})
  with pytest.raises(ValueError, match="num_events=0"):
    jaxsync.sim.run(strategy, loss, params, data, jaxsync.sim.TimeModel(num_workers=4), num_events=0)


def test_time_model_helpers():
  assert jaxsync.sim.compute_time_from_flops(1e6, 32, 1e12) == pytest.approx(3 * 1e6 * 32 / 1e12)
  tm = jaxsync.sim.TimeModel(num_workers=4, slow_fraction=0.5, slowdown=3.0)
  np.testing.assert_allclose(tm.mean_compute_times(), [1, 1, 3, 3])
  assert jaxsync.sim.message_bytes({"a": jnp.zeros([10]), "b": jnp.zeros([2, 2], jnp.bfloat16)}) == 48
  assert jaxsync.sim.link("100gbps").bandwidth == 100e9 / 8


@pytest.mark.parametrize("shape", [0.5, 1.0, 3.0, 100.0])
def test_loop_free_gamma_jitter_has_the_gamma_distribution(shape):
  import jax
  import scipy.stats

  from jaxsync._src.sim.jitter import unit_gamma

  seed = jax.numpy.asarray([12345, 678], jax.numpy.uint32)
  workers, steps = np.divmod(np.arange(20_000), 100)  # draws across workers and steps
  draws = np.asarray(jax.jit(jax.vmap(lambda w, s: unit_gamma(seed, w, s, shape)))(workers, steps))
  assert abs(draws.mean() - 1.0) < 4 * np.sqrt(1 / shape / draws.size)
  assert scipy.stats.kstest(draws * shape, scipy.stats.gamma(shape).cdf).pvalue > 1e-3
