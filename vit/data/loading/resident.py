"""The resident loader (data.loader=resident), for datasets that fit in the training device's memory: the split
lives on the device as uint8 and whole batches are augmented there, so on a GPU no CPU worker sits between it and
its next batch, and on a CPU no JPEG is decoded twice.

Per epoch: the shared training permutation (vit/data/loading/sampling.py, the torch loader's too); per batch of B
images, uint8 (B, 3, H, W) gathered on the device and handed to `BatchAugment` (vit/data/augment/batch.py: crop,
flip, policy, normalisation, erasing), the stage the torch loader's batches go through as well.
The decoded split comes from vit/data/loading/decoded_cache.py (decoded once, cached on disk as .npy, reused across
runs).

On a CPU it is the same code with the host's memory as the device's (data.loader=auto picks it there when the
decoded split fits).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from vit.data.augment.batch import BatchAugment
from vit.data.loading.sampling import epoch_order, evaluation_order


class ResidentLoader:
    """Iterable of (images float32 (B, 3, H, W) normalised, targets int64 (B,)) on `device`.

    Train: the epoch's permutation (from seed and epoch; `set_epoch` or one full pass advances it), every batch
    through `augment`, last partial batch dropped. Val: every image once in `evaluation_order`, only normalised.
    With world_size > 1 each rank takes every world_size-th index of the shared permutation.
    """

    def __init__(
        self,
        images: np.ndarray,
        targets: np.ndarray,
        augment: BatchAugment,
        *,
        batch_size: int,
        device: torch.device,
        train: bool,
        seed: int,
        repeats: int = 1,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        # (N, H, W, 3) uint8 -> (N, 3, H, W) uint8 on the device: a CIFAR-10 train split is 150 MB.
        self.images = torch.from_numpy(np.ascontiguousarray(images)).to(device).permute(0, 3, 1, 2).contiguous()
        self.targets = torch.from_numpy(np.asarray(targets, dtype=np.int64)).to(device)
        self.device = torch.device(device)
        self.augment = augment
        self.batch_size = batch_size
        self.train = train
        self.seed, self.repeats = seed, repeats if train else 1
        self.rank, self.world_size = rank, world_size
        self.epoch = 0
        self.skip = 0  # batches of the next epoch already trained (a resume inside an epoch)
        self.val_order = None if train else evaluation_order(np.asarray(targets))
        self.alternating_flip = augment.alternating_flip(len(self.targets), seed)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.skip = 0

    def skip_batches(self, count: int) -> None:
        """Start the next pass after its first `count` batches; the rest draw what they would have drawn."""
        self.skip = count

    def _order(self) -> torch.Tensor:
        n = len(self.targets)
        if not self.train:  # classes interleaved: a limited evaluation (limit_val_batches) sees every class
            order = self.val_order
        else:  # the same permutation on every rank (same seed), so the strided shards are disjoint
            order = epoch_order(n, self.seed, self.epoch, self.repeats)
        return order.to(self.device)[self.rank :: self.world_size]

    def _full_len(self) -> int:
        n = len(self.targets)
        if self.train:
            return (n // self.world_size) // self.batch_size
        return math.ceil(math.ceil(n / self.world_size) / self.batch_size)

    def __len__(self) -> int:
        return self._full_len() - min(self.skip, self._full_len())

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = self._order()
        skip, self.skip = self.skip, 0
        for b in range(skip, self._full_len()):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            generator = self.augment.generator(self.seed, self.epoch, self.rank, b) if self.train else None
            flip = self.alternating_flip(idx, self.epoch, self.device) if self.alternating_flip else None
            yield self.augment(self.images[idx], generator, flip), self.targets[idx]
        if self.train:
            self.epoch += 1
