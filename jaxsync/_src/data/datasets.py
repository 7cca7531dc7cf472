"""Datasets read offline: image classification (digits, bundled; Fashion-MNIST and MNIST, IDX files;
CIFAR-10/100, local files; synthetic) and next-token prediction on a text corpus (the Jargon File)."""

from __future__ import annotations

import dataclasses
import functools
import gzip
import importlib.util
import inspect
import os
import pathlib
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxsync._src.core import validation
from jaxsync._src.core.registry import Registry
from jaxsync._src.data import idx

_WHAT = "datasets"
# Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist) puts the four files here;
# the environment variable of the same name points elsewhere.
FASHION_MNIST_DIR = pathlib.Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_ENV = "FASHION_MNIST_DIR"
_IDX_FILES = {
  "train_images": ("train-images", "idx3"),
  "train_labels": ("train-labels", "idx1"),
  "test_images": ("t10k-images", "idx3"),
  "test_labels": ("t10k-labels", "idx1"),
}
_IDX_SOURCES = {
  "fashion_mnist": (
    "Debian's package dataset-fashion-mnist (apt-get install dataset-fashion-mnist, into "
    f"{FASHION_MNIST_DIR}), or https://github.com/zalandoresearch/fashion-mnist (data/fashion)"
  ),
  "mnist": "https://yann.lecun.com/exdb/mnist/ or any MNIST mirror (the four original files)",
}
_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
# Debian's jargon-text package (apt-get install jargon-text) installs the Jargon File 4.4.7 as
# plain UTF-8 text, gzipped, here; data_dir= or $JARGON_DIR points at another directory holding it.
JARGON_DIR = pathlib.Path("/usr/share/doc/jargon-text")
JARGON_ENV = "JARGON_DIR"
_JARGON_NAMES = ("jargon.txt.gz", "jargon.txt")
# A byte-level vocabulary: every byte value is a token.
BYTE_VOCABULARY = 256
_CIFAR_LAYOUT = {
  "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels", 10),
  "cifar100": ("cifar-100-python", ["train"], ["test"], b"fine_labels", 100),
}


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A dataset in memory: inputs under :attr:`input_key` and int32 labels under ``"label"``.

  For image classification the inputs are float32 images ``[N, H, W, C]``
  under ``"image"`` and the labels ``[N]``; for next-token prediction they are
  int32 token sequences ``[N, T]`` under ``"tokens"`` and the labels ``[N, T]``
  (the token after each position), ``num_classes`` being the vocabulary size.

  Attributes:
    name: the dataset name.
    train: ``{input_key: ..., "label": ...}`` for training.
    test: the held-out split, same keys.
    num_classes: the number of classes (the vocabulary size for tokens).
    input_key: ``"image"`` (the default) or ``"tokens"``: the batch key a
      model reads (:func:`jaxsync.models.register`'s ``inputs``).
    validation: a slice of the training examples held out of ``train`` for
      choosing hyperparameters (:func:`hold_out`), same keys; None without one.
  """

  name: str
  train: dict[str, np.ndarray]
  test: dict[str, np.ndarray]
  num_classes: int
  input_key: str = "image"
  validation: dict[str, np.ndarray] | None = None

  @property
  def input_shape(self) -> tuple[int, ...]:
    """One example's shape: ``(height, width, channels)`` of an image, or ``(sequence_length,)``."""
    return tuple(self.train[self.input_key].shape[1:])

  def map_dataset(self, split: str = "train"):
    """The examples of ``split`` (``"train"``, ``"test"`` or ``"validation"``) as a grain ``MapDataset``.

    For a user's own grain pipeline (shuffle, batch, map); the simulator's
    :class:`WorkerData` takes ``dataset.train`` as is, and
    :func:`worker_dataset` gives one worker's batches.
    """
    import grain

    arrays = {"train": self.train, "test": self.test, "validation": self.validation}.get(split)
    if arrays is None:
      valid = "'train', 'test' or 'validation'" if self.validation is not None else "'train' or 'test'"
      raise validation.invalid(_WHAT, "split", split, f"{valid} (a validation split comes from hold_out)")
    return grain.MapDataset.source(_Examples(arrays))


class _Examples:
  """A grain random-access source over in-memory arrays: element ``i`` is ``{key: array[i]}``."""

  def __init__(self, arrays: dict[str, np.ndarray]):
    self.arrays = arrays

  def __len__(self) -> int:
    return len(next(iter(self.arrays.values())))

  def __getitem__(self, index: int) -> dict[str, np.ndarray]:
    return {key: value[index] for key, value in self.arrays.items()}


DATASETS: Registry[Callable[..., Dataset]] = Registry(_WHAT)


def register(name: str) -> Callable[[Callable[..., Dataset]], Callable[..., Dataset]]:
  """Registers a dataset loader under ``name``: :func:`load` (and a config's ``data.name``) then takes it.

  :func:`load` calls the loader with those of its own keyword arguments
  (``data_dir``, ``seed``, ``num_examples``, ``num_classes``, ``input_shape``,
  ``sequence_length``)
  that the loader's signature names (all of them for ``**kwargs``); it
  returns a :class:`Dataset`. The built-in datasets are registered so.

  Args:
    name: the dataset's name, not registered yet (a ``ValueError`` otherwise).

  Returns:
    A decorator that registers the loader and returns it unchanged.

  Example:
    >>> import numpy as np
    >>> import jaxsync
    >>> @jaxsync.datasets.register("stripes_example")
    ... def stripes(seed):
    ...   images = np.random.default_rng(seed).normal(size=(100, 4, 4, 1)).astype(np.float32)
    ...   labels = (images[:, 0, 0, 0] > 0).astype(np.int32)
    ...   split = lambda lo, hi: {"image": images[lo:hi], "label": labels[lo:hi]}
    ...   return jaxsync.datasets.Dataset("stripes_example", split(0, 80), split(80, 100), 2)
    >>> data = jaxsync.datasets.load("stripes_example", seed=1)
    >>> data.input_shape, len(data.train["label"])
    ((4, 4, 1), 80)
  """
  return DATASETS.register(name)


def hold_out(dataset: Dataset, share: float) -> Dataset:
  """``dataset`` with the last ``share`` of its training examples moved to a validation split.

  The slice is fixed: the last ``round(share * N)`` examples of the training
  split in its stored order (a contiguous stretch of text just before the test
  tail for a corpus), whatever the run's seed, so that every tuning run of a
  grid holds out the same examples. They are not trained on; the test split is
  unchanged. Tuning runs score on this split only (``data.evaluate_on``).

  Args:
    dataset: a :class:`Dataset` without a validation split.
    share: the held-out share of the training examples, in ``(0, 1)``; both
      parts keep at least one example.

  Returns:
    A :class:`Dataset` whose ``train`` is the first ``N - round(share * N)``
    examples and ``validation`` the rest.

  Example:
    >>> import jaxsync
    >>> from jaxsync._src.data.datasets import hold_out
    >>> digits = hold_out(jaxsync.datasets.load("digits"), 0.1)
    >>> len(digits.train["label"]), len(digits.validation["label"]), len(digits.test["label"])
    (1294, 144, 359)
  """
  if dataset.validation is not None:
    raise ValueError(f"{_WHAT}: hold_out: the {dataset.name} dataset has a validation split already.")
  if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 < share < 1.0:
    raise validation.invalid(_WHAT, "share", share, "a share of the training examples in (0, 1)")
  count = len(dataset.train["label"])
  held = int(round(share * count))
  if not 0 < held < count:
    raise validation.invalid(
      _WHAT,
      "share",
      share,
      f"a share that holds out between 1 and {count - 1} of the {count} training examples",
    )
  keep = count - held
  return dataclasses.replace(
    dataset,
    train={k: v[:keep] for k, v in dataset.train.items()},
    validation={k: v[keep:] for k, v in dataset.train.items()},
  )


def _split(images, labels, test_fraction: float, seed: int):
  order = np.random.default_rng(seed).permutation(len(images))
  images, labels = images[order], labels[order]
  cut = len(images) - int(round(test_fraction * len(images)))
  return {"image": images[:cut], "label": labels[:cut]}, {"image": images[cut:], "label": labels[cut:]}


def _digits_table() -> np.ndarray:
  """scikit-learn's bundled digits, 1797 rows of 64 pixels (0-16) and a label, as ``load_digits`` reads them.

  Read straight from the package's data file: importing ``sklearn.datasets`` costs a second per
  process (every CLI run and multi-process worker on digits), reading 1797 lines a few milliseconds.
  """
  spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
  folders = list(spec.submodule_search_locations or ()) if spec else []
  path = pathlib.Path(folders[0] if folders else "/nonexistent") / "datasets" / "data" / "digits.csv.gz"
  if not path.is_file():  # a layout we do not know: ask scikit-learn itself
    from sklearn.datasets import load_digits

    digits = load_digits()
    return np.concatenate([digits.data, digits.target[:, None]], axis=1)
  with gzip.open(path, "rt") as f:
    return np.loadtxt(f, delimiter=",")


@register("digits")
def _digits(seed: int) -> Dataset:
  table = _digits_table()
  images = (table[:, :-1].reshape(-1, 8, 8) / 16.0).astype(np.float32)[..., None]
  train, test = _split(images, table[:, -1].astype(np.int32), 0.2, seed)
  return Dataset("digits", train, test, 10)


def _unpickle(path: pathlib.Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
  try:
    with path.open("rb") as f:
      entry = pickle.load(f, encoding="bytes")
    data = np.asarray(entry[b"data"], np.uint8)
    labels = np.asarray(entry[label_key], np.int64)
  except Exception as err:  # any unreadable file: say which and what was expected
    raise ValueError(
      f"{_WHAT}: {path} is not a CIFAR batch in the python format ({type(err).__name__}: {err}); expected a "
      f"pickled dict with b'data' (uint8, N x 3072) and {label_key!r}; get the 'python version' from {_CIFAR_URL}."
    ) from None
  if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
    raise ValueError(
      f"{_WHAT}: {path} has data of shape {data.shape} and {len(labels)} labels; expected N x 3072 and N labels."
    )
  return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), labels.astype(np.int32)


def _cifar(name: str, data_dir: Any) -> Dataset:
  folder_name, train_files, test_files, label_key, classes = _CIFAR_LAYOUT[name]
  if data_dir is None:
    raise ValueError(
      f"{_WHAT}: name={name!r} needs data_dir=...; expected a directory holding {folder_name}/ "
      f"(the python version from {_CIFAR_URL}, extracted). Nothing is downloaded at run time."
    )
  root = pathlib.Path(data_dir).expanduser()
  folder = root / folder_name if (root / folder_name).is_dir() else root
  missing = [f for f in train_files + test_files if not (folder / f).is_file()]
  if missing:
    raise ValueError(
      f"{_WHAT}: data_dir={str(data_dir)!r} lacks {', '.join(missing)} (looked in {folder}); expected "
      f"{folder_name}/ with {', '.join(train_files + test_files)} from {_CIFAR_URL}."
    )

  def read(files):
    parts = [_unpickle(folder / f, label_key) for f in files]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

  train_x, train_y = read(train_files)
  test_x, test_y = read(test_files)
  if train_y.min() < 0 or max(train_y.max(), test_y.max()) >= classes:
    raise ValueError(f"{_WHAT}: labels in {folder} fall outside [0, {classes}); expected {name} labels.")
  # Per-channel standardization with the training split's statistics.
  scaled = train_x.astype(np.float32) / 255.0
  mean, std = scaled.mean(axis=(0, 1, 2)), scaled.std(axis=(0, 1, 2)) + 1e-6
  train = {"image": (scaled - mean) / std, "label": train_y}
  test = {"image": (test_x.astype(np.float32) / 255.0 - mean) / std, "label": test_y}
  return Dataset(name, train, test, classes)


def _idx_path(folder: pathlib.Path, stem: str, kind: str) -> pathlib.Path | None:
  """The file of one split in ``folder``: ``stem-kind-ubyte`` (or ``stem.kind-ubyte``), gzipped or raw."""
  for name in (f"{stem}-{kind}-ubyte", f"{stem}.{kind}-ubyte"):
    for candidate in (folder / f"{name}.gz", folder / name):
      if candidate.is_file():
        return candidate
  return None


def _mnist_format(name: str, data_dir: Any) -> Dataset:
  """Fashion-MNIST or MNIST from the four IDX files, scaled to [0, 1] and standardized."""
  expected = ", ".join(f"{stem}-{kind}-ubyte[.gz]" for stem, kind in _IDX_FILES.values())
  if data_dir is None and name == "mnist":
    raise ValueError(
      f"{_WHAT}: name='mnist' needs data_dir=...; expected a directory holding {expected} "
      f"(from {_IDX_SOURCES['mnist']}). Nothing is downloaded at run time."
    )
  if data_dir is not None:
    folder, where = pathlib.Path(data_dir).expanduser(), "data_dir"
  elif os.environ.get(FASHION_MNIST_ENV):
    folder, where = pathlib.Path(os.environ[FASHION_MNIST_ENV]).expanduser(), f"${FASHION_MNIST_ENV}"
  else:
    folder, where = FASHION_MNIST_DIR, "the default directory"
  if not folder.is_dir():
    raise ValueError(
      f"{_WHAT}: {where} {str(folder)!r} does not exist; expected a directory holding {expected}, "
      f"from {_IDX_SOURCES[name]}."
    )
  paths = {key: _idx_path(folder, stem, kind) for key, (stem, kind) in _IDX_FILES.items()}
  missing = [f"{stem}-{kind}-ubyte[.gz]" for key, (stem, kind) in _IDX_FILES.items() if paths[key] is None]
  if missing:
    raise ValueError(
      f"{_WHAT}: {where} {str(folder)!r} lacks {', '.join(missing)}; expected {expected}, "
      f"from {_IDX_SOURCES[name]}."
    )
  # A config's builds (one per compared strategy) read the same files: parse them once per process.
  stats = {key: path.stat() for key, path in paths.items()}
  read = _read_mnist_format(
    name, tuple((key, str(path), stats[key].st_mtime_ns, stats[key].st_size) for key, path in paths.items())
  )
  return dataclasses.replace(read, train=dict(read.train), test=dict(read.test))


@functools.lru_cache(maxsize=4)
def _read_mnist_format(name: str, files: tuple[tuple[str, str, int, int], ...]) -> Dataset:
  """The checked, standardized arrays of four IDX files (``(key, path, mtime, size)``), read-only."""
  paths = {key: pathlib.Path(path) for key, path, _, _ in files}
  try:
    arrays = {key: idx.read(path, ndim=3 if "images" in key else 1) for key, path in paths.items()}
  except idx.IdxError as err:
    raise ValueError(f"{_WHAT}: {err}") from None
  for split in ("train", "test"):
    images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
    if len(images) != len(labels):
      raise ValueError(
        f"{_WHAT}: {paths[f'{split}_images']} holds {len(images):,} images but {paths[f'{split}_labels']} "
        f"{len(labels):,} labels; expected one label per image."
      )
    if labels.max(initial=0) > 9:
      raise ValueError(f"{_WHAT}: {paths[f'{split}_labels']} has label {labels.max()}; expected 0..9.")
  if arrays["train_images"].shape[1:] != arrays["test_images"].shape[1:]:
    raise ValueError(
      f"{_WHAT}: the train images are {arrays['train_images'].shape[1:]} and the test images "
      f"{arrays['test_images'].shape[1:]}; expected one image size."
    )
  # Scaled to [0, 1], then standardized with the training split's statistics (one channel).
  scaled = arrays["train_images"].astype(np.float32) / 255.0
  mean, std = float(scaled.mean()), float(scaled.std()) + 1e-6
  train = {"image": ((scaled - mean) / std)[..., None], "label": arrays["train_labels"].astype(np.int32)}
  test_scaled = arrays["test_images"].astype(np.float32) / 255.0
  test = {"image": ((test_scaled - mean) / std)[..., None], "label": arrays["test_labels"].astype(np.int32)}
  for array in [*train.values(), *test.values()]:
    array.setflags(write=False)  # shared by every load of these files in this process
  return Dataset(name, train, test, 10)


@register("fashion_mnist")
def _fashion_mnist(data_dir: Any) -> Dataset:
  return _mnist_format("fashion_mnist", data_dir)


@register("mnist")
def _mnist(data_dir: Any) -> Dataset:
  return _mnist_format("mnist", data_dir)


@register("cifar10")
def _cifar10(data_dir: Any) -> Dataset:
  return _cifar("cifar10", data_dir)


@register("cifar100")
def _cifar100(data_dir: Any) -> Dataset:
  return _cifar("cifar100", data_dir)


@register("synthetic")
def _synthetic(seed: int, num_examples: int, num_classes: int, input_shape) -> Dataset:
  num_examples = validation.check_int(_WHAT, "num_examples", num_examples, low=10)
  num_classes = validation.check_int(_WHAT, "num_classes", num_classes, low=2)
  rng = np.random.default_rng(seed)
  shape = tuple(input_shape)
  centers = rng.normal(size=(num_classes, *shape)).astype(np.float32)
  labels = rng.integers(0, num_classes, num_examples).astype(np.int32)
  images = centers[labels] + 1.5 * rng.normal(size=(num_examples, *shape)).astype(np.float32)
  train, test = _split(images, labels, 0.2, seed)
  return Dataset("synthetic", train, test, num_classes)


def _jargon_path(data_dir: Any) -> pathlib.Path:
  """The Jargon File: ``data_dir`` (the file or its folder), else ``$JARGON_DIR``, else Debian's place."""
  if data_dir is not None:
    folder, where = pathlib.Path(data_dir).expanduser(), "data_dir"
  elif os.environ.get(JARGON_ENV):
    folder, where = pathlib.Path(os.environ[JARGON_ENV]).expanduser(), f"${JARGON_ENV}"
  else:
    folder, where = JARGON_DIR, "the default directory"
  if folder.is_file():
    return folder
  for name in _JARGON_NAMES:
    if (folder / name).is_file():
      return folder / name
  raise ValueError(
    f"{_WHAT}: name='jargon' needs the Jargon File, and {where} {str(folder)!r} holds no "
    f"{' or '.join(_JARGON_NAMES)}; install Debian's package with: sudo apt-get install jargon-text "
    f"(it puts {JARGON_DIR / _JARGON_NAMES[0]}), or pass data_dir= a folder holding the Jargon File "
    "4.4.7 as plain text (jargon.txt, gzipped or not). Nothing is downloaded at run time."
  )


@functools.lru_cache(maxsize=2)
def _read_text(path: str, mtime_ns: int, size: int) -> np.ndarray:
  """The bytes of a text file (gunzipped if its name ends in .gz), read-only; cached per file version."""
  opener = gzip.open if path.endswith(".gz") else open
  try:
    with opener(path, "rb") as f:
      raw = f.read()
  except (OSError, EOFError) as err:
    raise ValueError(f"{_WHAT}: {path} could not be read ({type(err).__name__}: {err}).") from None
  data = np.frombuffer(raw, np.uint8)
  data.setflags(write=False)
  return data


def text_sequences(data: np.ndarray, sequence_length: int, test_fraction: float = 0.05):
  """Next-token training pairs from a stream of tokens, and a held-out contiguous tail.

  The last ``test_fraction`` of the stream is the test split, the rest the
  training split (no sequence crosses the cut). Each split is cut into
  consecutive, non-overlapping windows: example ``i`` has tokens
  ``x[i T : (i + 1) T]`` and labels ``x[i T + 1 : (i + 1) T + 1]``, the token
  after each position. The split and the windows depend on the stream only
  (no seed): the workers' shuffling is :class:`WorkerData`'s.

  Args:
    data: the token stream, ``[L]`` integers.
    sequence_length: ``T``, tokens per example.
    test_fraction: the held-out tail's share of the stream, in ``(0, 1)``.

  Returns:
    ``(train, test)``, each ``{"tokens": int32 [N, T], "label": int32 [N, T]}``.

  Example:
    >>> import numpy as np
    >>> from jaxsync._src.data.datasets import text_sequences
    >>> train, test = text_sequences(np.arange(100), sequence_length=4, test_fraction=0.2)
    >>> train["tokens"][1], train["label"][1], test["tokens"].shape
    (array([4, 5, 6, 7], dtype=int32), array([5, 6, 7, 8], dtype=int32), (4, 4))
  """
  sequence_length = validation.check_int(_WHAT, "sequence_length", sequence_length)
  data = np.asarray(data)
  cut = len(data) - int(round(test_fraction * len(data)))

  def windows(part: np.ndarray) -> dict[str, np.ndarray]:
    count = (len(part) - 1) // sequence_length
    if count < 1:
      raise validation.invalid(
        _WHAT, "sequence_length", sequence_length, f"at most {len(part) - 1}, the tokens of a split minus one"
      )
    span = part[: count * sequence_length + 1].astype(np.int32)
    return {
      "tokens": span[:-1].reshape(count, sequence_length),
      "label": span[1:].reshape(count, sequence_length),
    }

  return windows(data[:cut]), windows(data[cut:])


@register("jargon")
def _jargon(data_dir: Any, sequence_length: int) -> Dataset:
  path = _jargon_path(data_dir)
  stat = path.stat()
  train, test = text_sequences(_read_text(str(path), stat.st_mtime_ns, stat.st_size), sequence_length)
  return Dataset("jargon", train, test, BYTE_VOCABULARY, input_key="tokens")


def load(
  name: str,
  *,
  data_dir: str | None = None,
  seed: int = 0,
  num_examples: int = 10_000,
  num_classes: int = 10,
  input_shape: tuple[int, int, int] = (8, 8, 1),
  sequence_length: int = 64,
) -> Dataset:
  """Loads a dataset by name, offline.

  * ``digits``: scikit-learn's bundled 1,797 8x8 digits, scaled to [0, 1], a
    seeded 80/20 split.
  * ``fashion_mnist``: Zalando's Fashion-MNIST (60,000 train / 10,000 test
    28x28 grey images of 10 clothing classes, MIT licence) from the four
    standard IDX files in ``data_dir``, else in ``$FASHION_MNIST_DIR``, else
    where Debian's package ``dataset-fashion-mnist`` installs them
    (``/usr/share/datasets/fashion-mnist``).
  * ``mnist``: the same reader for a user's MNIST files (``data_dir`` required).
    Both are scaled to [0, 1] and standardized with the training statistics;
    IDX magic numbers, counts and shapes are checked, and a missing,
    truncated or mismatched file is an error naming it.
  * ``cifar10`` / ``cifar100``: the python version of CIFAR read from
    ``data_dir`` (the directory holding ``cifar-10-batches-py/`` or
    ``cifar-100-python/``, or that folder itself), standardized per channel
    with the training statistics. A missing or malformed directory raises a
    ``ValueError`` saying what was expected and where to get it.
  * ``synthetic``: ``num_examples`` Gaussian images around ``num_classes``
    random class centres, for scale.
  * ``jargon``: next-token prediction on the Jargon File 4.4.7 (Eric S.
    Raymond et al.; public domain; 1.68 MB of English text, UTF-8), from
    ``data_dir`` (the file ``jargon.txt[.gz]`` or its directory), else
    ``$JARGON_DIR``, else where Debian's package ``jargon-text`` installs it
    (``/usr/share/doc/jargon-text/jargon.txt.gz``). Byte-level tokens (a
    vocabulary of 256, ``num_classes``), examples of ``sequence_length``
    tokens under ``"tokens"`` with the next token at each position as
    ``"label"`` (:func:`text_sequences`); the last 5% of the text is the test
    split (about 26,000 train and 1,300 test sequences of 64 bytes).

  Args:
    name: one of :data:`DATASETS`: a built-in, or a dataset added with :func:`register`.
    data_dir: the CIFAR or (Fashion-)MNIST directory.
    seed: the split (and synthetic data) seed.
    num_examples, num_classes, input_shape: the synthetic set's size.
    sequence_length: tokens per example of a text dataset (``jargon``).

  Returns:
    A :class:`Dataset`.

  Example:
    >>> import jaxsync
    >>> digits = jaxsync.datasets.load("digits")
    >>> digits.input_shape, len(digits.train["label"]), len(digits.test["label"])
    ((8, 8, 1), 1438, 359)

  References:
    Krizhevsky, "Learning Multiple Layers of Features from Tiny Images", 2009
    (CIFAR-10/100); Xiao, Rasul, Vollgraf, "Fashion-MNIST: a Novel Image Dataset
    for Benchmarking Machine Learning Algorithms", arXiv:1708.07747, 2017;
    LeCun, Bottou, Bengio, Haffner, "Gradient-based learning applied to
    document recognition", Proc. IEEE 1998 (MNIST); Raymond (ed.), "The
    Jargon File", version 4.4.7, 2003 (public domain).
  """
  loader = DATASETS.lookup(name)
  if not callable(loader):
    raise validation.invalid(_WHAT, "name", name, f"a dataset loader (it names a {type(loader).__name__})")
  seed = validation.check_int(_WHAT, "seed", seed, low=0)
  given = dict(
    data_dir=data_dir,
    seed=seed,
    num_examples=num_examples,
    num_classes=num_classes,
    input_shape=input_shape,
    sequence_length=sequence_length,
  )
  parameters = inspect.signature(loader).parameters
  if not any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
    given = {k: v for k, v in given.items() if k in parameters}
  dataset = loader(**given)
  if not isinstance(dataset, Dataset):
    raise ValueError(
      f"{_WHAT}: the loader of name={name!r} returned a {type(dataset).__name__}; expected a "
      "jaxsync.datasets.Dataset."
    )
  check(dataset, name)
  return dataset


# What each input key holds: its dtype kind, the rank of one example, and its labels' rank per example.
_INPUT_LAYOUT = {"image": ("f", 3, 0, "float images [N, height, width, channels]"),
                 "tokens": ("iu", 1, 1, "integer tokens [N, sequence_length]")}  # fmt: skip


def check(dataset: Dataset, name: str | None = None) -> None:
  """Checks a dataset's splits before anything trains on it: keys, dtypes, shapes and label range.

  Each split (``train``, ``test``, ``validation``) must hold the inputs under
  :attr:`Dataset.input_key` (float images ``[N, H, W, C]``, or integer tokens
  ``[N, T]``) and integer labels under ``"label"`` (``[N]``, or ``[N, T]`` for
  tokens) in ``[0, num_classes)``, all with the same ``N``, the same example
  shape in every split, and at least one example.

  Raises:
    ValueError: one line naming the dataset, the split, the key and what was expected.
  """
  what = f"{_WHAT}: the dataset {name or dataset.name!r}"
  if dataset.input_key not in _INPUT_LAYOUT:
    raise ValueError(f"{what} has input_key={dataset.input_key!r}; expected 'image' or 'tokens'.")
  kinds, rank, label_rank, layout = _INPUT_LAYOUT[dataset.input_key]
  if (
    isinstance(dataset.num_classes, bool)
    or not isinstance(dataset.num_classes, int)
    or dataset.num_classes < 2
  ):
    raise ValueError(f"{what} has num_classes={dataset.num_classes!r}; expected an integer >= 2.")
  shapes = set()
  splits = {"train": dataset.train, "test": dataset.test, "validation": dataset.validation}
  for split, arrays in splits.items():
    if arrays is None and split == "validation":
      continue
    if not isinstance(arrays, dict):
      raise ValueError(f"{what}: its {split} split is a {type(arrays).__name__}; expected a dict of arrays.")
    missing = [k for k in (dataset.input_key, "label") if k not in arrays]
    if missing:
      raise ValueError(
        f"{what}: its {split} split has keys {sorted(arrays)}, without {missing}; expected "
        f"{dataset.input_key!r} ({layout}) and 'label' (integer class labels)."
      )
    inputs, labels = np.asarray(arrays[dataset.input_key]), np.asarray(arrays["label"])
    if inputs.dtype.kind not in kinds or inputs.ndim != rank + 1:
      raise ValueError(
        f"{what}: {split}[{dataset.input_key!r}] is {inputs.dtype} of shape {inputs.shape}; expected {layout}."
      )
    if labels.dtype.kind not in "iu" or labels.shape != inputs.shape[: 1 + label_rank]:
      raise ValueError(
        f"{what}: {split}['label'] is {labels.dtype} of shape {labels.shape}; expected integer labels of "
        f"shape {inputs.shape[: 1 + label_rank]} (one per {'token' if label_rank else 'example'})."
      )
    if not len(labels):
      raise ValueError(f"{what}: its {split} split is empty; expected at least one example.")
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= dataset.num_classes:
      raise ValueError(
        f"{what}: {split}['label'] spans {low}..{high}, outside the model's outputs 0..{dataset.num_classes - 1}; "
        f"expected labels in [0, num_classes={dataset.num_classes})."
      )
    if dataset.input_key == "tokens" and (int(inputs.min()) < 0 or int(inputs.max()) >= dataset.num_classes):
      raise ValueError(
        f"{what}: {split}['tokens'] spans {int(inputs.min())}..{int(inputs.max())}; expected token ids in "
        f"[0, num_classes={dataset.num_classes}) (the vocabulary)."
      )
    shapes.add(inputs.shape[1:])
  if len(shapes) > 1:
    raise ValueError(f"{what}: its splits' examples differ in shape ({sorted(shapes)}); expected one shape.")
