"""Data: where images come from (sources/), what happens to them (augment/), how they become batches (loading/).

`build_data`, `DataBundle` and `DataError` are loaded on first use (PEP 562), so `import vit.data.images` (the
image reader, PIL and numpy only) does not import torch: the ONNX runtime runs without it."""

from __future__ import annotations

__all__ = ["DataBundle", "DataError", "build_data"]


def __getattr__(name: str):
    if name == "DataError":
        from vit.data.errors import DataError

        return DataError
    if name == "DataBundle":
        from vit.data.loading.bundle import DataBundle

        return DataBundle
    if name == "build_data":
        from vit.data.loading.build import build_data

        return build_data
    raise AttributeError(f"module 'vit.data' has no attribute {name!r}")
