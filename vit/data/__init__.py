"""Data: datasets (CIFAR, image folders, archives, synthetic), transforms, CPU and GPU-resident loaders.

`build_data`, `DataBundle` and `DataError` are loaded on first use (PEP 562), so `import vit.data.images` (the
image reader, PIL and numpy only) does not import torch: the ONNX runtime runs without it."""

from __future__ import annotations

__all__ = ["DataBundle", "DataError", "build_data"]


def __getattr__(name: str):
    if name == "DataError":
        from vit.data.sources.datasets import DataError

        return DataError
    if name in ("DataBundle", "build_data"):
        from vit.data.loading import build as loader

        return getattr(loader, name)
    raise AttributeError(f"module 'vit.data' has no attribute {name!r}")
