"""Data: datasets (CIFAR, image folders, archives, synthetic), transforms, CPU and GPU-resident loaders."""

from vit.data.datasets import DataError
from vit.data.loader import DataBundle, build_data

__all__ = ["DataBundle", "DataError", "build_data"]
