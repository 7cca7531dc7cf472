"""A validation split held out of the training set, and tuning that scores on it only: the test set chooses
nothing (the learning-rate grids of the benchmarks, the advisor's short runs)."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib

import numpy as np
import pytest

import jaxsync
from jaxsync._src.app import config as config_lib
from jaxsync._src.app import experiment
from jaxsync._src.data.datasets import hold_out
from jaxsync._src.train import training

ROOT = pathlib.Path(__file__).resolve().parents[2]
harness = importlib.import_module("benchmarks.common.harness")


@pytest.fixture(autouse=True)
def _poisoned_dataset(scratch_registries):
  """The poisoned dataset, registered for this module's tests only."""
  jaxsync.datasets.register("stripes_poisoned_test")(_stripes_poisoned_test)


def _stripes_poisoned_test(seed):
  """Learnable stripes whose test images are NaN: any run that reads the test set reports a NaN loss."""
  rng = np.random.default_rng(seed)
  images = rng.normal(size=(400, 4, 4, 1)).astype(np.float32)
  labels = (images[:, 0, 0, 0] > 0).astype(np.int32)
  test = {"image": np.full((50, 4, 4, 1), np.nan, np.float32), "label": np.zeros(50, np.int32)}
  return jaxsync.datasets.Dataset("stripes_poisoned_test", {"image": images, "label": labels}, test, 2)


def _config(*overrides: str) -> config_lib.Config:
  return config_lib.load(
    ROOT / "configs" / "quickstart.yaml",
    [
      "data.name=stripes_poisoned_test",
      "model.name=mlp",
      "cluster.num_workers=2",
      "run.gradients=120",
      "run.chunk=20",
      "run.eval_every=20",
      "run.target_accuracy=0.7",
      *overrides,
    ],
  )


def _train(config: config_lib.Config, run_dir: pathlib.Path) -> dict:
  exp = experiment.build(config)
  result = training.train(
    exp.simulator(), exp.model.params, run_dir, tensorboard=False, make_plots=False, **exp.train_kwargs()
  )
  return result.summary


def test_hold_out_moves_a_fixed_tail_of_the_training_set_to_a_validation_split():
  digits = jaxsync.datasets.load("digits", seed=3)
  held = hold_out(digits, 0.1)
  assert len(held.train["label"]) == 1294 and len(held.validation["label"]) == 144
  np.testing.assert_array_equal(held.validation["image"], digits.train["image"][1294:])
  np.testing.assert_array_equal(held.train["label"], digits.train["label"][:1294])
  np.testing.assert_array_equal(held.test["image"], digits.test["image"])  # the test split is untouched
  assert len(list(held.map_dataset("validation"))) == 144
  with pytest.raises(ValueError, match=r"share=1\.0 is invalid; expected a share of the training examples"):
    hold_out(digits, 1.0)
  with pytest.raises(ValueError, match="share=0.0001 is invalid; expected a share that holds out between 1"):
    hold_out(digits, 0.0001)
  with pytest.raises(ValueError, match="has a validation split already"):
    hold_out(held, 0.1)
  with pytest.raises(ValueError, match="split='validation' is invalid; expected 'train' or 'test'"):
    digits.map_dataset("validation")


def test_the_config_checks_the_validation_split_and_what_is_evaluated():
  with pytest.raises(
    config_lib.ConfigError, match=r"data.validation=1.0 is invalid; expected a share .* in \[0, 1\)"
  ):
    _config("data.validation=1.0")
  with pytest.raises(
    config_lib.ConfigError, match="data.evaluate_on='validation' is invalid; expected 'test' while"
  ):
    _config("data.evaluate_on=validation")
  with pytest.raises(
    config_lib.ConfigError, match="data.evaluate_on='tests' is invalid.*did you mean 'test'"
  ):
    _config("data.evaluate_on=tests")


def test_a_run_on_its_validation_split_never_reads_the_test_set(tmp_path):
  # The poison shows: a run evaluated on the test set reports a NaN loss and counts as diverged ...
  poisoned = _train(_config("data.validation=0.2"), tmp_path / "test")
  assert np.isnan(poisoned["final_loss"]) and poisoned["diverged"]
  assert poisoned["evaluated_on"] == "test" and np.isfinite(poisoned["final_validation_accuracy"])
  # ... and a tuning run, the same config for tuning, reads only its validation slice.
  tuning = _train(experiment.for_tuning(_config("data.validation=0.2")), tmp_path / "tuning")
  assert tuning["evaluated_on"] == "validation" and not tuning["diverged"]
  assert not any(k in tuning for k in ("final_accuracy", "final_loss", "best_accuracy"))
  assert tuning["final_validation_accuracy"] == poisoned["final_validation_accuracy"]  # same training
  assert tuning["target"]["metric"] == "validation_accuracy" and tuning["time_to_target_held"] is not None
  assert harness.tuning_score(tuning) == tuning["final_validation_accuracy"]
  # A tuning run of the default share trains on 90% of the examples.
  assert len(experiment.build(experiment.for_tuning(_config())).data.arrays["label"]) == 360


def test_a_tuning_score_from_the_test_set_is_refused():
  tested = {"evaluated_on": "test", "final_accuracy": 0.9, "final_validation_accuracy": 0.8}
  with pytest.raises(RuntimeError, match="evaluated on 'test' .* scores a test metric"):
    harness.tuning_score(tested)
  with pytest.raises(RuntimeError, match="with target 'accuracy'"):
    harness.tuning_score(
      {"evaluated_on": "validation", "final_validation_accuracy": 0.8, "target": {"metric": "accuracy"}}
    )


def test_the_benchmark_grid_tunes_on_the_validation_split_of_real_runs(tmp_path):
  """Every run a grid trains is stored with its validation score and without a test metric; a committed
  report made from picks on the test set can only be rebuilt, never tuned again so."""
  args = harness.parser("").parse_args(["--results-dir", str(tmp_path), "--runs-dir", str(tmp_path / "runs")])
  bench = harness.Benchmark("made_up", "Made up", args, [], seeds=1)
  config = _config()
  config = dataclasses.replace(config, compare=dataclasses.replace(config.compare, strategies=["bsp"]))
  best, text = bench.tune(config, {"bsp": ("bsp", {})}, (0.03, 0.3), objective="time")
  assert best["bsp"] in (0.03, 0.3) and "the target on the validation split" in text
  entries = [e["summary"] for e in harness.results_store.read_entries(bench.store.path).values()]
  assert len(entries) == 2
  for summary in entries:
    assert summary["evaluated_on"] == "validation" and "final_accuracy" not in summary
    assert np.isfinite(summary["final_validation_accuracy"])  # the NaN test set was never read
  bench.write()
  assert "picked on a validation split" in (tmp_path / "made_up.md").read_text()
  with pytest.raises(SystemExit, match="--picks-on-test-set only rebuilds a report"):
    harness.Benchmark("m", "M", harness.parser("").parse_args(["--picks-on-test-set"]), [], seeds=1)
