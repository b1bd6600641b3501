"""The training order's one extra: repeated augmentation, shared by the torch sampler and the GPU loader."""

from __future__ import annotations

import torch


def repeat_order(order: torch.Tensor, repeats: int) -> torch.Tensor:
    """Repeated augmentation (Hoffer et al. 2020; DeiT's `--repeated-aug`): every image of the first
    len / repeats of the permutation `repeats` times in a row, cut to the epoch's usual length. The copies share a
    global batch (under torchrun they land on different ranks) and each is augmented on its own."""
    if repeats <= 1:
        return order
    return order.repeat_interleave(repeats)[: len(order)]


def epoch_order(size: int, seed: int, epoch: int, repeats: int = 1) -> torch.Tensor:
    """The training order of `epoch`, int64 (size,): one permutation per (seed, epoch), DistributedSampler's
    (seeded with seed + epoch), with repeated augmentation's copies in between. Both loaders take it, so with the
    same seed they visit the same images in the same batches."""
    generator = torch.Generator().manual_seed(seed + epoch)
    return repeat_order(torch.randperm(size, generator=generator), repeats)
