"""jaxsync.datasets: classification data read offline (digits, CIFAR-10/100 from local files, synthetic).

Per-worker grain pipelines (:func:`worker_dataset`, :func:`worker_iterator`) read the
batches of a :class:`jaxsync.sim.WorkerData` on the host, for a runtime with one
process per worker.
"""

from jaxsync._src.data.datasets import DATASETS, Dataset, load
from jaxsync._src.data.grain_data import worker_dataset, worker_iterator

__all__ = ["DATASETS", "Dataset", "load", "worker_dataset", "worker_iterator"]
