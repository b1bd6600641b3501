"""The torch loader: a DataLoader whose workers decode each image and cut its crop (vit/data/augment/transforms.py),
its samplers (the shared training permutation, every image evaluated once over all ranks), and `DeviceBatches`,
which moves its uint8 (B, 3, H, W) batches to the device and through `BatchAugment` there. The stream of tar shards
(stream.py) runs its DataLoader through the same pieces."""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from vit.data.augment.batch import BatchAugment
from vit.data.loading.sampling import epoch_order, evaluation_order
from vit.data.resources import num_workers
from vit.data.sources.splits import targets_of


class Transformed(Dataset):
    """Apply a transform to the (PIL image, target) pairs of another dataset."""

    def __init__(self, dataset: Dataset, transform: Callable) -> None:
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, target = self.dataset[index]
        return self.transform(image), target


def init_worker(worker_id: int) -> None:
    """In each loader worker: numpy/random seeded from torch's per-worker seed (reproducible augmentation), and a
    process group of its own. Ctrl-C, `timeout` or a scheduler signal the run's whole process group; the trainer
    then finishes its step, writes last.pt and shuts its workers down itself, where a worker killed by that signal
    first would take the run down with a traceback. Outside the group, rather than ignoring the signals, a worker
    still stops when it is asked directly: by its DataLoader, or by Python's exit (which would wait forever for a
    worker that ignored SIGTERM)."""
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)
    try:
        os.setpgid(0, 0)
    except OSError:  # not permitted here: leave the group's signals to the trainer instead
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


class ShardSampler(Sampler):
    """Evaluation indices: rank r takes positions r, r + world_size, ... of `order` (default 0..size-1), so every
    image is evaluated exactly once over all ranks (DistributedSampler would pad with repeats, skewing the
    all-reduced accuracy)."""

    def __init__(self, size: int, rank: int = 0, world_size: int = 1, order: torch.Tensor | None = None) -> None:
        self.size, self.rank, self.world_size = size, rank, world_size
        self.order = order

    def __iter__(self):
        if self.order is None:
            return iter(range(self.rank, self.size, self.world_size))
        return iter(self.order[self.rank :: self.world_size].tolist())

    def __len__(self) -> int:
        return len(range(self.rank, self.size, self.world_size))


def class_balanced_order(dataset) -> torch.Tensor | None:
    """`evaluation_order` of a split whose labels are known (every indexable split here: image folders, CIFAR,
    synthetic, Hugging Face), so a limited evaluation sees every class; None leaves the split's own order."""
    base = dataset.dataset if isinstance(dataset, Transformed) else dataset
    try:
        targets = targets_of(base)
    except (AttributeError, TypeError):
        return None
    return evaluation_order(targets) if len(targets) == len(dataset) else None


class EpochSampler(DistributedSampler):
    """The train order: `epoch_order` (one permutation per (seed, epoch), the GPU-resident loader's too) shared by
    all ranks, rank r taking every world_size-th index; `skip` starts the next epoch after samples already trained
    (a resume inside an epoch); `repeats` > 1: repeated augmentation."""

    def __init__(self, dataset, world_size: int, rank: int, seed: int, repeats: int = 1) -> None:
        super().__init__(dataset, world_size, rank, shuffle=True, seed=seed, drop_last=True)
        self.skip = 0
        self.repeats = repeats

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.skip = 0

    def epoch_indices(self) -> torch.Tensor:
        """int64 (num_samples,): this rank's indices of the epoch, from its first sample (before `skip`)."""
        order = epoch_order(len(self.dataset), self.seed, self.epoch, self.repeats)
        return order[: self.total_size][self.rank : self.total_size : self.num_replicas]

    def __iter__(self):
        return iter(self.epoch_indices().tolist()[self.skip :])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.skip)


def torch_loader(dataset, cfg, *, train, device, seed, rank, world_size, batch_size):
    workers = num_workers(cfg)
    if train:
        # Also with one process: the permutation is then the same for every world size, and global batch k
        # (rank r takes every world_size-th index) holds the same images whether 1 or N processes train.
        sampler = EpochSampler(dataset, world_size, rank, seed, repeats=cfg.repeated_aug or 1)
    else:
        sampler = ShardSampler(len(dataset), rank, world_size, order=class_balanced_order(dataset))
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=train,
        num_workers=workers,
        pin_memory=cfg.pin_memory and torch.device(device).type == "cuda",
        persistent_workers=workers > 0,
        worker_init_fn=init_worker,
        generator=generator,
    )
    return loader, sampler


class DeviceBatches:
    """The torch loader as the trainer sees it: the DataLoader's uint8 (B, 3, H, W) batches moved to the device
    and through `augment` there, float32 (B, 3, H, W) normalised out. `set_epoch`, `skip_batches` and
    `generator` (the DataLoader's, seeding its workers) are what the trainer drives each epoch."""

    def __init__(self, loader: DataLoader, sampler, augment: BatchAugment, *, device, seed: int, rank: int) -> None:
        self.loader, self.sampler, self.augment = loader, sampler, augment
        self.device, self.seed, self.rank = torch.device(device), seed, rank
        self.train = augment.train
        self.epoch, self.start = 0, 0
        self.dataset, self.batch_size, self.generator = loader.dataset, loader.batch_size, loader.generator
        # data.augment.hflip_alternate: each batch's indices come from the sampler's order (EpochSampler only; the
        # shard stream refuses the setting, having no fixed index per image)
        self.alternating_flip = augment.alternating_flip(len(self.dataset), seed)

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.start = epoch, 0
        if hasattr(self.sampler, "set_epoch"):  # the train split's order
            self.sampler.set_epoch(epoch)

    def skip_batches(self, count: int) -> None:
        """Start the next pass after its first `count` batches (their samples skipped by the sampler)."""
        self.sampler.skip = count * self.batch_size
        self.start = count

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        start, self.start = self.start, 0
        order = self.sampler.epoch_indices() if self.alternating_flip else None
        for index, (images, targets) in enumerate(self.loader, start):
            images = images.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            generator = self.augment.generator(self.seed, self.epoch, self.rank, index) if self.train else None
            flip = None
            if order is not None:  # the batch's images: drop_last batches of the sampler's order
                indices = order[index * self.batch_size : (index + 1) * self.batch_size]
                flip = self.alternating_flip(indices, self.epoch, self.device)
            yield self.augment(images, generator, flip), targets
        if self.train:  # as the GPU-resident loader: a full pass moves on to the next epoch
            self.epoch += 1
            self.sampler.set_epoch(self.epoch)
