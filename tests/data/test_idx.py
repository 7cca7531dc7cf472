"""MNIST-format (IDX) files: Fashion-MNIST from Debian's package, and the checks every file gets."""

from __future__ import annotations

import gzip
import pathlib
import struct

import numpy as np
import pytest

import jaxsync
from jaxsync._src.data import idx
from jaxsync._src.data.datasets import FASHION_MNIST_DIR

FILES = {
  "train-images-idx3-ubyte": (3, (12, 28, 28)),
  "train-labels-idx1-ubyte": (1, (12,)),
  "t10k-images-idx3-ubyte": (3, (5, 28, 28)),
  "t10k-labels-idx1-ubyte": (1, (5,)),
}


def _write(path: pathlib.Path, array: np.ndarray, *, gz: bool, magic: bytes | None = None) -> pathlib.Path:
  header = (magic or bytes([0, 0, 0x08, array.ndim])) + b"".join(struct.pack(">I", d) for d in array.shape)
  raw = header + array.astype(np.uint8).tobytes()
  path = path.with_name(path.name + ".gz") if gz else path
  path.write_bytes(gzip.compress(raw) if gz else raw)
  return path


def _mnist_dir(folder: pathlib.Path, *, gz: bool) -> pathlib.Path:
  rng = np.random.default_rng(0)
  for name, (ndim, shape) in FILES.items():
    values = rng.integers(0, 10 if ndim == 1 else 256, shape)
    _write(folder / name, values, gz=gz)
  return folder


@pytest.mark.parametrize("gz", [True, False])
def test_a_users_mnist_files_gzipped_or_raw(tmp_path, gz):
  data = jaxsync.datasets.load("mnist", data_dir=_mnist_dir(tmp_path, gz=gz))
  assert data.input_shape == (28, 28, 1) and data.num_classes == 10
  assert data.train["image"].shape == (12, 28, 28, 1) and data.test["label"].shape == (5,)
  assert abs(float(data.train["image"].mean())) < 1e-5 and data.train["image"].dtype == np.float32


def test_the_same_files_are_parsed_once_per_process_read_only_and_reread_when_they_change(tmp_path):
  folder = _mnist_dir(tmp_path, gz=True)
  first, again = (jaxsync.datasets.load("mnist", data_dir=folder) for _ in range(2))
  assert again.train["image"] is first.train["image"] and again.train is not first.train
  with pytest.raises(ValueError, match="read-only"):
    first.train["image"][0, 0, 0, 0] = 1.0  # shared arrays cannot be changed under another load
  _write(folder / "train-labels-idx1-ubyte", np.full([12], 3), gz=True)  # new contents, new size
  assert np.all(jaxsync.datasets.load("mnist", data_dir=folder).train["label"] == 3)


def test_bad_files_are_named_with_what_is_wrong(tmp_path):
  folder = _mnist_dir(tmp_path, gz=False)
  images = folder / "train-images-idx3-ubyte"
  whole = images.read_bytes()
  images.write_bytes(whole[:-100])
  with pytest.raises(
    ValueError, match="train-images-idx3-ubyte is truncated: .*9,408 values, and it holds 9,308"
  ):
    jaxsync.datasets.load("mnist", data_dir=folder)
  images.write_bytes(b"\x00\x00\x0d\x03" + whole[4:])  # float32 type code
  with pytest.raises(ValueError, match="magic number 0x00000d03.*expected 0x00000803"):
    jaxsync.datasets.load("mnist", data_dir=folder)
  images.write_bytes(b"PK\x03\x04" + whole[4:])
  with pytest.raises(ValueError, match="train-images-idx3-ubyte is not an IDX file"):
    jaxsync.datasets.load("mnist", data_dir=folder)
  images.write_bytes(whole)
  _write(folder / "train-labels-idx1-ubyte", np.zeros(11), gz=False)  # one label short
  with pytest.raises(ValueError, match="12 images but .*train-labels-idx1-ubyte 11 labels"):
    jaxsync.datasets.load("mnist", data_dir=folder)
  (folder / "t10k-images-idx3-ubyte").unlink()
  with pytest.raises(ValueError, match="lacks t10k-images-idx3-ubyte"):
    jaxsync.datasets.load("mnist", data_dir=folder)
  (folder / "broken-idx1-ubyte.gz").write_bytes(b"\x1f\x8b" + b"\x00" * 20)
  with pytest.raises(idx.IdxError, match="damaged gzip"):
    idx.read(folder / "broken-idx1-ubyte.gz", ndim=1)


def test_fashion_mnist_dir_in_the_environment_points_elsewhere(tmp_path, monkeypatch):
  monkeypatch.setenv("FASHION_MNIST_DIR", str(_mnist_dir(tmp_path, gz=True)))
  assert jaxsync.datasets.load("fashion_mnist").train["label"].shape == (12,)  # the 12 images there
  monkeypatch.setenv("FASHION_MNIST_DIR", str(tmp_path / "nowhere"))
  with pytest.raises(ValueError, match=r"\$FASHION_MNIST_DIR '.*nowhere' does not exist"):
    jaxsync.datasets.load("fashion_mnist")


def test_a_missing_directory_names_the_debian_package_and_the_files(tmp_path):
  with pytest.raises(ValueError) as err:
    jaxsync.datasets.load("fashion_mnist", data_dir=tmp_path / "nowhere")
  for words in (
    "nowhere",
    "does not exist",
    "dataset-fashion-mnist",
    "t10k-labels-idx1-ubyte",
    "zalandoresearch",
  ):
    assert words in str(err.value), (words, str(err.value))
  with pytest.raises(ValueError, match="name='mnist' needs data_dir"):
    jaxsync.datasets.load("mnist")


def test_fashion_mnist_from_debians_package_is_the_whole_balanced_set():
  assert FASHION_MNIST_DIR.is_dir(), (
    f"{FASHION_MNIST_DIR} is missing: apt-get install dataset-fashion-mnist (.ci/run installs it)"
  )
  data = jaxsync.datasets.load("fashion_mnist")
  assert data.train["image"].shape == (60_000, 28, 28, 1) and data.test["image"].shape == (10_000, 28, 28, 1)
  np.testing.assert_array_equal(np.bincount(data.train["label"]), [6000] * 10)
  np.testing.assert_array_equal(np.bincount(data.test["label"]), [1000] * 10)
  examples = data.map_dataset("test")  # a grain MapDataset, like the others
  assert len(examples) == 10_000 and examples[7]["image"].shape == (28, 28, 1)
  assert int(examples[7]["label"]) == int(data.test["label"][7])


def test_a_short_simulated_run_learns_fashion_mnist():
  """Eight workers, ASGD, 400 gradients of an MLP: far above chance (0.10) on the 10,000 test images.

  (The MLP keeps this test's compile short; configs/fashion_mnist.yaml trains the LeNet-style CNN.)"""
  import jax

  data = jaxsync.datasets.load("fashion_mnist")
  model = jaxsync.models.make("mlp", input_shape=data.input_shape, num_classes=10, hidden=(128,))
  workers = jaxsync.sim.WorkerData(data.train, num_workers=8, batch_size=32)
  params, history = jaxsync.sim.run(
    jaxsync.strategies.make("asp", 8, learning_rate=0.05),
    jaxsync.models.classification_loss(model),
    model.params,
    workers,
    jaxsync.sim.TimeModel(num_workers=8),
    num_events=400,
  )
  evaluate = jax.jit(jaxsync.models.classification_metrics(model, data.test["image"], data.test["label"]))
  assert history.updates == 400 and float(evaluate(params)["accuracy"]) > 0.7
