"""jaxsync.datasets: data read offline: images (digits, Fashion-MNIST, CIFAR-10/100 from local files,
synthetic) and text (the Jargon File, byte-level next-token prediction).

``load(name, ...)`` returns a :class:`Dataset` (:func:`hold_out` moves a fixed slice of its
training examples to a validation split, for tuning); :data:`DATASETS` is the
registry of names, and :func:`register` adds a loader of one's own::

  @jaxsync.datasets.register("my_images")
  def my_images(data_dir, seed):
    ...  # returns a jaxsync.datasets.Dataset

Per-worker grain pipelines (:func:`worker_dataset`, :func:`worker_iterator`) read the
batches of a :class:`jaxsync.sim.WorkerData` on the host, for a runtime with one
process per worker.
"""

from jaxsync._src.data.datasets import DATASETS, Dataset, hold_out, load, register, text_sequences
from jaxsync._src.data.grain_data import worker_dataset, worker_iterator

__all__ = [
  "DATASETS",
  "Dataset",
  "hold_out",
  "load",
  "register",
  "text_sequences",
  "worker_dataset",
  "worker_iterator",
]
