"""Models by name (shapes, parameter counts, FLOPs, learning) and datasets read offline."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsync


@pytest.mark.parametrize(
  ("name", "shape", "params"),
  [
    ("mlp", (8, 8, 1), 64 * 128 + 128 + 128 * 10 + 10),
    ("cnn", (8, 8, 1), 151_306),
    ("resnet20", (32, 32, 3), 269_722),
  ],
)
def test_models_have_the_expected_size_and_output(name, shape, params):
  model = jaxsync.models.make(name, input_shape=shape, num_classes=10)
  assert model.num_params == params
  logits = jax.jit(model.apply)(model.params, jaxsync.models.zeros_batch(model, 3))
  assert logits.shape == (3, 10)
  # The forward FLOPs come from XLA's cost analysis: at least the dense and conv multiply-adds.
  assert model.flops_per_sample > 2 * (params - 1000) * (0.9 if name == "mlp" else 1)
  assert all(isinstance(k, str) for k in _keys(model.params))


def _keys(tree, out=None):
  out = [] if out is None else out
  for k, v in tree.items():
    out.append(k)
    if isinstance(v, dict):
      _keys(v, out)
  return out


def test_resnet20_is_the_cifar_variant():
  model = jaxsync.models.make("resnet20", input_shape=(32, 32, 3), num_classes=100)
  assert model.num_params == 269_722 + 64 * 90 + 90  # a wider head for 100 classes
  # He et al. 2016: about 41M multiply-adds, i.e. about 82M FLOPs per 32x32 image, over the
  # valid taps; ShiftConv's matmul also multiplies the zero padding at the borders (98M).
  assert (
    80e6 < jaxsync.models.make("resnet20", input_shape=(32, 32, 3), num_classes=10).flops_per_sample < 100e6
  )


def test_small_cnn_learns_digits_through_the_simulator():
  data = jaxsync.datasets.load("digits")
  model = jaxsync.models.make("cnn", input_shape=data.input_shape, num_classes=data.num_classes)
  evaluate = jaxsync.models.classification_metrics(
    model, data.test["image"], data.test["label"], batch_size=128
  )
  before = float(evaluate(model.params)["accuracy"])
  strategy = jaxsync.strategies.make("ormo", 4, learning_rate=0.02)
  workers = jaxsync.sim.WorkerData(data.train, num_workers=4, batch_size=32)
  time = jaxsync.sim.TimeModel(
    num_workers=4, compute_time=jaxsync.sim.compute_time_from_flops(model.flops_per_sample, 32, 1e11)
  )
  final, history = jaxsync.sim.run(
    strategy, jaxsync.models.classification_loss(model), model.params, workers, time, num_events=300
  )
  after = evaluate(final)
  assert before < 0.3 and float(after["accuracy"]) > 0.85, (before, after)
  # A worker-step costs 3 forward passes of the batch at 100 GFLOP/s; messages add their time.
  assert time.compute_time == pytest.approx(3 * model.flops_per_sample * 32 / 1e11)
  assert history.simulated_time > 0.9 * 300 / 4 * time.compute_time


def test_metrics_pad_the_last_batch_with_real_images_and_mask_them():
  model = jaxsync.models.make("mlp", input_shape=(8, 8, 1), num_classes=10)
  data = jaxsync.datasets.load("digits")
  x, y = data.test["image"], data.test["label"]
  whole = jaxsync.models.classification_metrics(model, x, y, batch_size=len(y))(model.params)
  chunks = jaxsync.models.classification_metrics(model, x, y, batch_size=100)(
    model.params
  )  # 359 = 3*100 + 59
  np.testing.assert_allclose(float(whole["accuracy"]), float(chunks["accuracy"]), rtol=1e-6)
  np.testing.assert_allclose(float(whole["loss"]), float(chunks["loss"]), rtol=1e-5)


def test_the_held_out_set_is_an_argument_of_the_compiled_programs_not_a_constant():
  # 2,000 synthetic 8x8 images (512 KB): folded in as a constant they would take over 1 MB of the
  # programs' text (and Fashion-MNIST's 31 MB test set about 0.4 s of every compilation).
  data = jaxsync.datasets.load("synthetic", num_examples=10_000, input_shape=(8, 8, 1))
  model = jaxsync.models.make("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
  evaluate = jaxsync.models.classification_metrics(model, data.test["image"], data.test["label"])
  sim = jaxsync.sim.Simulator(
    jaxsync.strategies.make("asp", 2),
    jaxsync.models.classification_loss(model),
    jaxsync.sim.WorkerData(data.train, num_workers=2, batch_size=16),
    jaxsync.sim.TimeModel(num_workers=2),
    eval_fn=evaluate,
    eval_every=5,
  )
  state = sim.init(model.params)
  arrays = sim.schedule.eval_arrays()
  assert sum(x.size for x in arrays) >= 2000 * 64
  loop = sim._advance.lower(state, jnp.float32(np.inf), sim.data, arrays, num_events=10).as_text()
  assert len(loop) < 500_000, len(loop)
  assert len(sim._evaluate.lower(arrays, model.params).as_text()) < 100_000
  # The loop's own evaluation (after event 10, of the final parameters) equals the plain function's.
  final, history = sim.run(model.params, 10)
  assert history.eval_event[-1] == 10
  np.testing.assert_allclose(
    history.eval_metrics["accuracy"][-1], float(evaluate(final)["accuracy"]), rtol=1e-6
  )
  np.testing.assert_allclose(history.eval_metrics["loss"][-1], float(evaluate(final)["loss"]), rtol=1e-5)


def test_invalid_model_arguments():
  with pytest.raises(ValueError, match="name='vgg'"):
    jaxsync.models.make("vgg", input_shape=(8, 8, 1), num_classes=10)
  with pytest.raises(ValueError, match="input_shape"):
    jaxsync.models.make("cnn", input_shape=(8, 8), num_classes=10)
  with pytest.raises(ValueError, match="unknown option"):
    jaxsync.models.make("cnn", input_shape=(8, 8, 1), num_classes=10, hidden=(3,))


def _write_cifar(root, name="cifar10", per_file=6):
  rng = np.random.default_rng(0)
  folder, files, key, classes = (
    ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"], b"labels", 10)
    if name == "cifar10"
    else ("cifar-100-python", ["train", "test"], b"fine_labels", 100)
  )
  (root / folder).mkdir()
  written = {}
  for f in files:
    images = rng.integers(0, 256, size=(per_file, 3, 32, 32), dtype=np.uint8)
    labels = rng.integers(0, classes, per_file).tolist()
    with open(root / folder / f, "wb") as out:
      pickle.dump({b"data": images.reshape(per_file, 3072), key: labels, b"batch_label": b"x"}, out)
    written[f] = (images, labels)
  return written


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_reader_reads_the_python_format(tmp_path, name):
  written = _write_cifar(tmp_path, name)
  data = jaxsync.datasets.load(name, data_dir=str(tmp_path))
  train_files = [f for f in written if f not in ("test_batch", "test")]
  assert data.input_shape == (32, 32, 3) and data.num_classes == (10 if name == "cifar10" else 100)
  assert len(data.train["label"]) == 6 * len(train_files) and len(data.test["label"]) == 6
  np.testing.assert_array_equal(data.train["label"][:6], written[train_files[0]][1])
  # Channels last, standardized with the training statistics.
  raw = np.concatenate([written[f][0] for f in train_files]).transpose(0, 2, 3, 1).astype(np.float32) / 255
  expected = (raw - raw.mean(axis=(0, 1, 2))) / (raw.std(axis=(0, 1, 2)) + 1e-6)
  np.testing.assert_allclose(data.train["image"], expected, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(data.train["image"].mean(axis=(0, 1, 2)), 0.0, atol=1e-4)


def test_cifar_errors_say_what_was_expected_and_where_to_get_it(tmp_path):
  with pytest.raises(ValueError, match="needs data_dir"):
    jaxsync.datasets.load("cifar10")
  with pytest.raises(ValueError, match=r"lacks data_batch_1.*cs.toronto.edu"):
    jaxsync.datasets.load("cifar10", data_dir=str(tmp_path))
  _write_cifar(tmp_path)
  (tmp_path / "cifar-10-batches-py" / "data_batch_3").write_bytes(b"not a pickle")
  with pytest.raises(ValueError, match="data_batch_3 is not a CIFAR batch"):
    jaxsync.datasets.load("cifar10", data_dir=str(tmp_path))
  with pytest.raises(ValueError, match="name='imagenet'"):
    jaxsync.datasets.load("imagenet")


def test_synthetic_and_digits_are_deterministic():
  a = jaxsync.datasets.load("synthetic", num_examples=200, num_classes=4, input_shape=(4, 4, 2), seed=1)
  b = jaxsync.datasets.load("synthetic", num_examples=200, num_classes=4, input_shape=(4, 4, 2), seed=1)
  np.testing.assert_array_equal(a.train["image"], b.train["image"])
  assert a.input_shape == (4, 4, 2) and len(a.train["label"]) + len(a.test["label"]) == 200
  d = jaxsync.datasets.load("digits")
  assert float(jnp.max(d.train["image"])) == 1.0 and d.num_classes == 10


def test_digits_read_from_the_bundled_file_equal_scikit_learns_load_digits():
  from sklearn.datasets import load_digits

  reference = load_digits()
  d = jaxsync.datasets.load("digits", seed=3)
  images = np.concatenate([d.train["image"], d.test["image"]])[..., 0]
  labels = np.concatenate([d.train["label"], d.test["label"]])
  order = np.random.default_rng(3).permutation(len(reference.target))  # the split's shuffle
  np.testing.assert_array_equal(images, (reference.images[order] / 16.0).astype(np.float32))
  np.testing.assert_array_equal(labels, reference.target[order])
  assert images.dtype == np.float32 and labels.dtype == np.int32 and len(d.test["label"]) == 359


def test_importing_the_cli_imports_neither_matplotlib_nor_scikit_learn():
  # Every CLI run and multi-process worker pays what ``import jaxsync.cli`` imports; the plots and the
  # digits loader import these when they are used.
  import subprocess
  import sys

  code = "import sys, jaxsync.cli; print(sorted({'matplotlib', 'sklearn'} & set(sys.modules)))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
  assert out.strip() == "[]"


@pytest.mark.parametrize(
  ("shape", "features", "kernel", "strides", "depthwise", "use_bias"),
  [
    ((2, 8, 8, 3), 5, (3, 3), 1, False, True),
    ((2, 8, 8, 4), 6, (3, 3), 2, False, False),
    ((2, 7, 9, 4), 6, (3, 3), 2, False, True),
    ((2, 6, 6, 4), 4, (3, 3), 2, True, False),
    ((2, 5, 5, 4), 4, (3, 3), 1, True, False),
    ((2, 6, 6, 4), 7, (1, 1), 1, False, False),
  ],
)
def test_shift_conv_equals_flax_conv_with_the_same_parameters(
  shape, features, kernel, strides, depthwise, use_bias
):
  from flax import nnx

  from jaxsync._src.models.layers import ShiftConv

  channels = shape[-1]
  ours = ShiftConv(
    channels, features, kernel, strides=strides, depthwise=depthwise, use_bias=use_bias, rngs=nnx.Rngs(3)
  )
  flax_conv = nnx.Conv(
    channels,
    features,
    kernel,
    strides=strides,
    feature_group_count=channels if depthwise else 1,
    use_bias=use_bias,
    rngs=nnx.Rngs(3),
  )
  # Same initializer, same key: the parameters are identical, not just the shapes.
  np.testing.assert_array_equal(ours.kernel[...], flax_conv.kernel[...])
  if use_bias:
    flax_conv.bias[...] = jnp.linspace(-1.0, 1.0, features)
    ours.bias[...] = jnp.linspace(-1.0, 1.0, features)
  x = jax.random.normal(jax.random.key(0), shape)
  got = jax.jit(lambda x: ours(x))(x)
  np.testing.assert_allclose(got, flax_conv(x), rtol=1e-5, atol=1e-5)
