"""Typed configs: YAML in, unknown keys and wrong types rejected with the key's name, --set overrides."""

from __future__ import annotations

import dataclasses
import pathlib
import re

import pytest
import yaml

import jaxsync
from jaxsync._src.app import config, config_reference, experiment

QUICKSTART = pathlib.Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


def test_defaults_and_a_full_round_trip(tmp_path):
  path = tmp_path / "c.yaml"
  path.write_text(
    "name: quick\nstrategy: {name: asp, options: {learning_rate: 0.1}}\ncluster: {num_workers: 4, slowdown: 2}\n"
  )
  cfg = config.load(
    path,
    ["run.gradients=800", "strategy.options.learning_rate=0.05", "model.name=mlp", "model.hidden=[64, 32]"],
  )
  assert cfg.name == "quick" and cfg.strategy.name == "asp"
  assert cfg.strategy.options == {"learning_rate": 0.05}
  assert (
    cfg.cluster.num_workers == 4 and cfg.cluster.slowdown == 2.0 and isinstance(cfg.cluster.slowdown, float)
  )
  assert cfg.run.gradients == 800 and cfg.model.hidden == [64, 32]
  assert cfg.data.name == "digits"  # untouched sections keep their defaults
  assert config.from_dict(config.to_dict(cfg)) == cfg


@pytest.mark.parametrize(
  ("raw", "overrides", "words"),
  [
    ({"clster": {}}, [], ["unknown config key clster", "cluster"]),
    ({"cluster": {"num_worker": 8}}, [], ["cluster.num_worker", "num_workers"]),
    ({}, ["run.gradient=5"], ["run.gradient", "gradients"]),
    ({"cluster": {"num_workers": "eight"}}, [], ["cluster.num_workers='eight'", "integer"]),
    ({"cluster": {"num_workers": 8.5}}, [], ["cluster.num_workers=8.5", "integer"]),
    ({"run": {"max_time": "soon"}}, [], ["run.max_time='soon'", "number"]),
    ({"model": {"hidden": 64}}, [], ["model.hidden=64", "list"]),
    ({"model": {"hidden": [64, "x"]}}, [], ["model.hidden[1]='x'"]),
    ({"strategy": {"options": [1]}}, [], ["strategy.options=[1]", "mapping"]),
    ({"data": 3}, [], ["data=3", "mapping"]),
    ({"cluster": {"message_bytes": 0}}, [], ["cluster.message_bytes=0", "byte count > 0"]),
    ({}, ["gradients"], ["override 'gradients'", "key.path=value"]),
    ({}, ["strategy.schedule.kind=linear"], ["strategy.schedule.kind='linear'", "constant, step, cosine"]),
    ({}, ["strategy.schedule.unit=steps"], ["strategy.schedule.unit='steps'", "updates, epochs"]),
    ({}, ["strategy.schedule.warmup=-1"], ["strategy.schedule.warmup=-1", ">= 0"]),
    ({}, ["strategy.schedule.warmup_from=1/N"], ["strategy.schedule.warmup_from='1/N'", "1/num_workers"]),
    ({}, ["strategy.schedule.warmup_from=1.5"], ["strategy.schedule.warmup_from=1.5", "[0, 1]"]),
    (
      {"strategy": {"schedule": {"kind": "step", "boundaries": [5, 2]}}},
      [],
      ["strategy.schedule.boundaries=[5.0, 2.0]", "increasing"],
    ),
    (
      {"strategy": {"schedule": {"boundaries": [5]}}},
      [],
      ["strategy.schedule.boundaries=[5.0]", "kind is step"],
    ),
    ({}, ["strategy.schedule.decay=0"], ["strategy.schedule.decay=0", "(0, 1]"]),
    ({}, ["cluster.server_bandwidth=fast"], ["server_bandwidth='fast'", "10GB/s"]),
    ({}, ["run.gradients=[1"], ["not valid YAML"]),
    ({}, ["run.gradient_batch=0"], ["run.gradient_batch=0", "positive"]),
  ],
)
def test_bad_configs_name_the_key_the_value_and_what_is_valid(tmp_path, raw, overrides, words):
  import yaml

  path = tmp_path / "c.yaml"
  path.write_text(yaml.safe_dump(raw))
  with pytest.raises(config.ConfigError) as err:
    config.load(path, overrides)
  for word in words:
    assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize(
  ("text", "value"),
  [("1e-3", 1e-3), ("1E-3", 1e-3), (".5", 0.5), ("1_000", 1000.0), ("2.5e2", 250.0), ("1e+0", 1.0)],
)
def test_numbers_are_read_as_people_write_them_in_every_place(tmp_path, text, value):
  # YAML 1.1 (PyYAML's default) reads 1e-3 as a string; configs and --set read it as a number.
  path = tmp_path / "c.yaml"
  path.write_text(
    f"strategy: {{name: asp, options: {{learning_rate: {text}}}}}\ncluster: {{compute_time: {text}}}\n"
  )
  from_file = config.load(path)
  assert from_file.strategy.options["learning_rate"] == value and from_file.cluster.compute_time == value
  from_set = config.load(path, [f"strategy.options.learning_rate={text}", f"run.max_time={text}"])
  assert from_set.strategy.options["learning_rate"] == value
  assert from_set.run.max_time == value and isinstance(from_set.run.max_time, float)


def test_integer_keys_take_integral_numbers_in_any_form(tmp_path):
  path = tmp_path / "c.yaml"
  path.write_text("run: {gradients: 1_000}\n")
  assert config.load(path).run.gradients == 1000
  assert config.load(path, ["run.gradients=2e3"]).run.gradients == 2000
  with pytest.raises(config.ConfigError, match="run.gradients=2.5"):
    config.load(path, ["run.gradients=2.5"])
  # A strategy built from a config with 1e-3 trains with that learning rate (the string never reaches it).
  import jaxsync

  cfg = config.load(path, ["strategy.name=ormo", "strategy.options.learning_rate=1e-3"])
  assert jaxsync.strategies.make("ormo", 4, **cfg.strategy.options).options["learning_rate"] == 1e-3


def test_missing_or_malformed_files(tmp_path):
  with pytest.raises(config.ConfigError, match="does not exist"):
    config.load(tmp_path / "nope.yaml")
  bad = tmp_path / "bad.yaml"
  bad.write_text("- just\n- a list\n")
  with pytest.raises(config.ConfigError, match="expected a mapping"):
    config.load(bad)


CONFIGS = pathlib.Path(__file__).parents[2] / "configs"


# configs/plan/ holds plans (jaxsync plan), tested in tests/plan.
@pytest.mark.parametrize(
  "path", sorted(p for p in CONFIGS.rglob("*.yaml") if p.parent.name != "plan"), ids=str
)
def test_every_shipped_config_loads_and_builds(path):
  from jaxsync._src.app import experiment

  cfg = config.load(path)
  exp = experiment.build(cfg)
  assert exp.num_events >= 1 and exp.strategy.num_workers == cfg.cluster.num_workers
  for name in cfg.compare.strategies:  # every compared strategy builds with its options too
    experiment.build(experiment.for_strategy(cfg, name, cfg.seed))


def test_a_gradient_batch_past_the_workers_is_refused_at_build_and_one_within_reaches_the_simulator():
  from jaxsync._src.app import experiment

  cfg = config.from_dict({"cluster": {"num_workers": 4}, "run": {"gradient_batch": 5}})
  with pytest.raises(config.ConfigError, match=r"run: .*gradient_batch=5 .*from 1 to the 4 workers"):
    experiment.build(cfg)
  cfg = config.from_dict({"cluster": {"num_workers": 4}, "run": {"gradient_batch": 3}})
  assert experiment.build(cfg).simulator().gradient_batch == 3


def test_message_bytes_times_the_exchanges_of_a_bigger_model():
  from jaxsync._src.app import experiment

  cfg = config.from_dict({"cluster": {"num_workers": 2, "message_bytes": 171_000_000, "link": "10gbps"}})
  time_model = experiment.build(cfg).time_model
  assert time_model.message_bytes == 171_000_000
  assert abs(time_model.transfer_time() - 171e6 / 1.25e9) < 1e-9  # ResNet101 at 10 Gbit/s: 0.137 s
  own = experiment.build(config.from_dict({"cluster": {"num_workers": 2}}))
  assert own.time_model.message_bytes is None  # null: the simulator fills in the model's own size ...
  assert (
    own.time_model.with_message_bytes(own.model.params).message_bytes < 1_000_000
  )  # ... the CNN's ~0.6 MB


def test_a_schedule_in_epochs_becomes_steps_of_each_strategys_clock(tmp_path):
  """digits: 1,438 training images, batch 32, 4 workers: an epoch is 44.9 asp updates, 11.2 bsp rounds."""
  import jaxsync
  from jaxsync._src.app import experiment

  sets = [
    "cluster.num_workers=4",
    "strategy.options={learning_rate: 0.1}",
    "strategy.schedule={kind: step, unit: epochs, warmup: 1, warmup_from: 1/num_workers, boundaries: [2]}",
  ]
  cfg = config.load(pathlib.Path(__file__).parents[2] / "configs" / "quickstart.yaml", sets)
  examples = len(experiment.build(cfg).dataset.train["label"])
  for name, per_epoch in (("asp", examples / 32), ("bsp", examples / 32 / 4)):
    strategy = jaxsync.strategies.make(name, 4, learning_rate=0.1)
    rate = experiment.learning_rate(experiment.for_strategy(cfg, name, 0), strategy, num_examples=examples)
    assert float(rate(0)) == pytest.approx(0.1 / 4)  # the warm-up starts at lr / num_workers
    assert float(rate(per_epoch)) == pytest.approx(0.1)  # and ends after one epoch of this clock
    assert float(rate(2 * per_epoch - 1)) == pytest.approx(0.1) and float(
      rate(2 * per_epoch)
    ) == pytest.approx(0.01)
  # The linear scaling rule: bsp averages 4 x 32 gradients per update, so 0.1 x 128 / 32.
  scaled = config.load(
    pathlib.Path(__file__).parents[2] / "configs" / "quickstart.yaml",
    [*sets, "strategy.schedule.scale_with_batch=32", "strategy.schedule.warmup=0", "strategy.name=bsp"],
  )
  bsp = jaxsync.strategies.make("bsp", 4, learning_rate=0.1)
  assert float(experiment.learning_rate(scaled, bsp, num_examples=examples)(0)) == pytest.approx(0.4)


def _leaf_keys(tree, prefix=""):
  for key, value in tree.items():
    if isinstance(value, dict) and key not in ("options",):  # options are a mapping value, not a section
      yield from _leaf_keys(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}"


def test_the_reference_lists_every_key_with_its_default_type_and_meaning():
  rows = {r.key: r for r in config_reference.reference()}
  leaves = set(_leaf_keys(config.to_dict(config.Config())))
  assert {k for k, r in rows.items() if r.type != "section"} == leaves
  assert all(r.meaning for r in rows.values())
  assert rows["run.gradients"].default == "4000" and rows["run.gradients"].type == "integer"
  assert rows["cluster.device_flops"].default == "1e+11"
  assert rows["run.max_time"].type == "number or null" and rows["run.max_time"].default == "null"
  assert rows["cluster.server_bandwidth"].type == "string or number or null"
  assert rows["compare.strategies"].default == "[]" and rows["compare.strategies"].type == "list of strings"
  assert rows["strategy.schedule"].type == "section"


def test_a_key_without_a_meaning_is_caught():
  import dataclasses

  @dataclasses.dataclass(frozen=True)
  class Undocumented:
    size: int = 3

  with pytest.raises(KeyError, match="meaning"):
    config_reference.reference(Undocumented)


def test_the_markdown_reference_has_one_row_per_key():
  text = config_reference.reference_markdown()
  keys = [r.key for r in config_reference.reference() if r.type != "section"]
  assert all(text.count(f"| `{k}` |") == 1 for k in keys)
  assert "### `strategy.schedule`" in text


def test_setting_one_of_two_alternative_keys_unsets_the_other(tmp_path):
  path = tmp_path / "c.yaml"
  path.write_text("run: {eval_every: null, eval_every_time: 0.05}\n")
  by_updates = config.load(path, ["run.eval_every=50"])
  assert by_updates.run.eval_every == 50 and by_updates.run.eval_every_time is None
  with pytest.raises(config.ConfigError, match="exactly one of run.eval_every and run.eval_every_time"):
    config.load(path, ["run.eval_every=50", "run.eval_every_time=0.1"])  # both given: both kept, refused
  on_time = config.load(tmp_path / "c.yaml", ["run.eval_every_time=0.2"])
  assert on_time.run.eval_every is None and on_time.run.eval_every_time == 0.2


def test_a_measured_link_reaches_the_time_model_and_a_config_with_it_round_trips(tmp_path):
  raw = {
    "model": {"name": "mlp"},
    "cluster": {
      "link": {"latency": 3e-5, "bandwidth": 1.1e8},
      "calibration": {"link": "measured: round trips to tcp://10.0.0.2:4399"},
    },
  }
  cfg = config.from_dict(raw)
  exp = experiment.build(cfg)
  assert exp.time_model.link == jaxsync.sim.Link(latency=3e-5, bandwidth=1.1e8)
  # What a run directory keeps (config.yaml) reads back the same.
  path = tmp_path / "config.yaml"
  path.write_text(yaml.safe_dump(config.to_dict(cfg)))
  assert config.load(path) == cfg


def test_emulated_slow_workers_are_the_time_models_slow_workers():
  cfg = config.load(QUICKSTART, ["cluster.num_workers=4", "cluster.slow_fraction=0.5", "cluster.slowdown=3"])
  assert experiment.build(cfg).slowdowns() is None  # real workers at their own speed by default
  on = experiment.build(
    dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, emulate_slow_workers=True))
  )
  assert on.slowdowns() == (1.0, 1.0, 3.0, 3.0)


@pytest.mark.parametrize(
  ("override", "hint"),
  [
    ("strategy.name=ormoo", "did you mean 'ormo'?"),
    ("strategy.options.momentom=0.5", "did you mean 'momentum'?"),
    ("modle.name=mlp", "did you mean 'model'?"),
    ("cluster.num_worker=4", "did you mean 'num_workers'?"),
    ("data.name=fashion-mnist", "did you mean 'fashion_mnist'?"),
    ("strategy.schedule.kind=cosin", "did you mean 'cosine'?"),
  ],
)
def test_a_mistyped_key_or_name_gets_the_closest_valid_one(override, hint):
  with pytest.raises(config.ConfigError, match=re.escape(hint)):
    config.load(QUICKSTART, [override])


def test_an_option_renamed_for_one_name_per_concept_is_still_accepted_in_a_config():
  cfg = config.load(
    QUICKSTART,
    ["strategy.name=async_local_sgd", "strategy.options={delay: 3}"],
  )
  with pytest.warns(FutureWarning, match="delay= is the old name of momentum_period="):
    strategy = jaxsync.strategies.make(cfg.strategy.name, 4, **cfg.strategy.options)
  assert strategy.options["momentum_period"] == 3
  # compare and calibrate pass the shared options on by strategy: the old name is one it takes.
  assert experiment.for_strategy(cfg, "async_local_sgd", 0).strategy.options == {"delay": 3}
  assert experiment.dropped_options(cfg, "async_local_sgd") == []
