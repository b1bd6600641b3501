"""The random draws of the batch augmentation, always taken from a CPU generator and then moved to the batch's
device: the same seed gives the same crops, flips, ops and boxes on a CPU and on a GPU (CUDA's generator is a
different algorithm, so draws taken there would differ). Each draw is B values or a few times that, so the copy is
small; `non_blocking` keeps it from waiting for the kernels already queued on the GPU."""

from __future__ import annotations

import torch


def rand(n: int, generator: torch.Generator | None, device: torch.device, dtype=torch.float32) -> torch.Tensor:
    """U[0, 1) of shape (n,) on `device`."""
    return torch.rand(n, generator=generator, dtype=dtype).to(device, non_blocking=True)


def randn(n: int, generator: torch.Generator | None, device: torch.device, dtype=torch.float32) -> torch.Tensor:
    """N(0, 1) of shape (n,) on `device`."""
    return torch.randn(n, generator=generator, dtype=dtype).to(device, non_blocking=True)


def randint(high: int, shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """int64 uniform in [0, high) of `shape` on `device`."""
    return torch.randint(high, shape, generator=generator).to(device, non_blocking=True)
