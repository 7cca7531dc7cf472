"""Models and datasets by name: registries a user adds to with a decorator, as the built-ins are added."""

from __future__ import annotations

import numpy as np
import pytest
from flax import nnx

import jaxsync
from jaxsync._src.app import config as config_lib

import helpers


def _linear(input_shape, num_classes, rngs, *, bias=True):
  height, width, channels = input_shape
  dense = nnx.Linear(height * width * channels, num_classes, use_bias=bias, rngs=rngs)
  return nnx.Sequential(lambda x: x.reshape(x.shape[0], -1), dense)


def _blobs(name, seed, num_classes=3):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, 60).astype(np.int32)
  images = (labels[:, None, None, None] + rng.normal(size=(60, 2, 2, 1))).astype(np.float32)
  split = lambda lo, hi: {"image": images[lo:hi], "label": labels[lo:hi]}
  return jaxsync.datasets.Dataset(name, split(0, 48), split(48, 60), num_classes)


def test_the_built_ins_are_registered_in_their_listed_order():
  assert tuple(jaxsync.models.MODELS) == ("mlp", "cnn", "lenet", "resnet20", "mobilenet", "transformer")
  assert tuple(jaxsync.datasets.DATASETS) == (
    "digits",
    "fashion_mnist",
    "mnist",
    "cifar10",
    "cifar100",
    "synthetic",
    "jargon",
  )


def test_a_registered_model_is_made_by_name_with_its_options(scratch_registries):
  assert jaxsync.models.register("linear")(_linear) is _linear
  assert "linear" in jaxsync.models.MODELS
  model = jaxsync.models.make("linear", input_shape=(4, 4, 2), num_classes=3, bias=False, seed=1)
  assert (model.name, model.num_params, model.input_shape) == ("linear", 32 * 3, (4, 4, 2))
  assert model.apply(model.params, jaxsync.models.zeros_batch(model, 5)).shape == (5, 3)
  assert model.flops_per_sample > 0
  with pytest.raises(
    ValueError, match=r"unknown option\(s\) \['width'\] for name='linear'; 'linear' takes 'bias'"
  ):
    jaxsync.models.make("linear", input_shape=(4, 4, 2), num_classes=3, width=8)
  # A config names it as it names a built-in: config validation reads the registry.
  assert config_lib.load(helpers.QUICKSTART, ["model.name=linear"]).model.name == "linear"


def test_a_registered_dataset_is_loaded_by_name_with_the_arguments_it_names(scratch_registries):
  seen = {}

  @jaxsync.datasets.register("blobs")
  def blobs(seed, num_classes):
    seen.update(seed=seed, num_classes=num_classes)
    return _blobs("blobs", seed, num_classes)

  @jaxsync.datasets.register("blobs_kw")
  def blobs_kw(**kwargs):
    seen.update(kwargs)
    return _blobs("blobs_kw", kwargs["seed"])

  data = jaxsync.datasets.load("blobs", seed=3, num_classes=4, data_dir="/unused")
  assert seen == {"seed": 3, "num_classes": 4}
  assert (data.name, data.input_shape, data.num_classes, len(data.train["label"])) == (
    "blobs",
    (2, 2, 1),
    4,
    48,
  )
  jaxsync.datasets.load("blobs_kw", seed=2, data_dir="/here")
  assert set(seen) == {"seed", "num_classes", "data_dir", "num_examples", "input_shape", "sequence_length"}
  assert seen["data_dir"] == "/here"
  assert config_lib.load(helpers.QUICKSTART, ["data.name=blobs"]).data.name == "blobs"


def test_a_builder_must_return_what_its_registry_holds(scratch_registries):
  jaxsync.models.register("not_a_module")(lambda input_shape, num_classes, rngs: "a string")
  with pytest.raises(ValueError, match=r"models: the builder of name='not_a_module' returned a str"):
    jaxsync.models.make("not_a_module", input_shape=(2, 2, 1), num_classes=2)
  jaxsync.datasets.register("not_a_dataset")(lambda seed: {"image": None})
  with pytest.raises(ValueError, match=r"datasets: the loader of name='not_a_dataset' returned a dict"):
    jaxsync.datasets.load("not_a_dataset")


@pytest.mark.parametrize(
  ("register", "name"),
  [(jaxsync.models.register, "mlp"), (jaxsync.datasets.register, "digits")],
  ids=["models", "datasets"],
)
def test_a_taken_or_empty_name_is_refused(scratch_registries, register, name):
  with pytest.raises(ValueError, match=rf"name='{name}' is invalid; expected a name not registered yet"):
    register(name)
  register("mine")(lambda **options: None)
  with pytest.raises(
    ValueError, match=r"name='mine' is invalid; expected a name not registered yet \(.*mine\)"
  ):
    register("mine")
  with pytest.raises(ValueError, match="name='' is invalid; expected a non-empty string"):
    register("")


def test_an_unknown_name_is_refused_with_the_registered_names(scratch_registries):
  jaxsync.models.register("linear")(_linear)
  with pytest.raises(
    ValueError,
    match=r"models: name='vgg' is invalid; expected one of 'mlp', 'cnn', 'lenet', .*'linear', or module:attribute",
  ):
    jaxsync.models.make("vgg", input_shape=(8, 8, 1), num_classes=10)
  with pytest.raises(
    ValueError, match=r"datasets: name='imagenet' is invalid; expected one of 'digits', .*'synthetic'"
  ):
    jaxsync.datasets.load("imagenet")
