"""jaxsync.datasets: classification data read offline (digits, CIFAR-10/100 from local files, synthetic)."""

from jaxsync._src.datasets import DATASETS, Dataset, load

__all__ = ["DATASETS", "Dataset", "load"]
