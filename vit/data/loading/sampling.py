"""The orders a loader visits a split in: the training order with repeated augmentation, and the evaluation order
whose every prefix is class-balanced. Shared by the torch samplers and the GPU-resident loader."""

from __future__ import annotations

import numpy as np
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


def evaluation_order(targets) -> torch.Tensor:
    """Every index of a split once, int64 (N,), classes interleaved so that any prefix holds each class in
    proportion to its size: `trainer.limit_val_batches=n` then evaluates a class-balanced sample, not the first
    class or two of a split sorted by class (image folders are). Which image of a class comes first is fixed (seed
    0), the same on every rank and run. The full pass visits the same images as before, so its accuracy is the same."""
    targets = np.asarray(targets)
    rng = np.random.default_rng(0)
    position = np.empty(len(targets), dtype=np.float64)
    for c in np.unique(targets):
        members = rng.permutation(np.flatnonzero(targets == c))
        position[members] = (np.arange(len(members)) + 0.5) / len(members)  # where in its class: (0, 1)
    # Ties (equal-sized classes) keep class order: c0, c1, ..., c0, c1, ...
    order = np.lexsort((targets, position))
    return torch.from_numpy(order.astype(np.int64))
