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
