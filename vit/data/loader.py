"""`build_data(cfg.data)`: datasets, transforms and loaders assembled into one `DataBundle`."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from vit.data.datasets import DataError, Splits, build_splits
from vit.data.gpu_loader import GpuLoader, cached_split
from vit.data.sampling import repeat_order
from vit.data.transforms import mean_std, mixup_and_criterion, train_transform, val_transform

LOADERS = ("auto", "torch", "gpu")


@dataclass
class DataBundle:
    train_loader: Iterable  # (images float (B, 3, H, W) normalised, targets int64 (B,)); len() = batches
    val_loader: Iterable
    num_classes: int
    class_to_idx: dict[str, int]
    mixup_fn: Callable | None  # timm Mixup, applied by the trainer on the device
    train_criterion: torch.nn.Module
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    img_size: int
    num_train: int
    num_val: int
    train_sampler: Sampler | None = None  # the torch loader's DistributedSampler, to `set_epoch` on
    loader_kind: str = "torch"
    val_name: str = "val"  # "holdout" with data.holdout, else the split's own name
    test_loader: Iterable | None = None  # with data.holdout: the split the holdout replaced, for the final report
    test_name: str | None = None


class Transformed(Dataset):
    """Apply a transform to the (PIL image, target) pairs of another dataset."""

    def __init__(self, dataset: Dataset, transform: Callable) -> None:
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, target = self.dataset[index]
        return self.transform(image), target


def default_workers() -> int:
    return min(8, os.cpu_count() or 1)


def _seed_worker(worker_id: int) -> None:
    # Each worker's numpy/random state from torch's per-worker seed, so augmentations are reproducible.
    import random

    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


class ShardSampler(Sampler):
    """Validation indices rank, rank + world_size, ...: every image evaluated exactly once over all ranks
    (DistributedSampler would pad with repeats, skewing the all-reduced accuracy)."""

    def __init__(self, size: int, rank: int = 0, world_size: int = 1) -> None:
        self.size, self.rank, self.world_size = size, rank, world_size

    def __iter__(self):
        return iter(range(self.rank, self.size, self.world_size))

    def __len__(self) -> int:
        return len(range(self.rank, self.size, self.world_size))


class EpochSampler(DistributedSampler):
    """The train order: one permutation per (seed, epoch) shared by all ranks, rank r taking every
    world_size-th index; `skip` starts the next epoch after samples already trained (a resume inside an epoch);
    `repeats` > 1: repeated augmentation (`repeat_order`)."""

    def __init__(self, dataset, world_size: int, rank: int, seed: int, repeats: int = 1) -> None:
        super().__init__(dataset, world_size, rank, shuffle=True, seed=seed, drop_last=True)
        self.skip = 0
        self.repeats = repeats

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self.skip = 0

    def __iter__(self):
        if self.repeats <= 1:
            indices = list(super().__iter__())
        else:  # DistributedSampler's permutation and sharding, with the repeats in between
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = repeat_order(torch.randperm(len(self.dataset), generator=generator), self.repeats)
            indices = order[: self.total_size][self.rank : self.total_size : self.num_replicas].tolist()
        return iter(indices[self.skip :])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.skip)


def _torch_loader(dataset, cfg, *, train, device, seed, rank, world_size, batch_size):
    workers = cfg.get("num_workers")
    workers = default_workers() if workers is None else int(workers)
    if train:
        # Also with one process: the permutation is then the same for every world size, and global batch k
        # (rank r takes every world_size-th index) holds the same images whether 1 or N processes train.
        sampler = EpochSampler(dataset, world_size, rank, seed, repeats=int(cfg.get("repeated_aug") or 1))
    else:
        sampler = ShardSampler(len(dataset), rank, world_size)
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=train,
        num_workers=workers,
        pin_memory=bool(cfg.get("pin_memory", True)) and torch.device(device).type == "cuda",
        persistent_workers=workers > 0,
        worker_init_fn=_seed_worker,
        generator=generator,
    )
    return loader, sampler


def _gpu_fits(splits: Splits, img_size: int, device: torch.device) -> bool:
    """Whether the splits as uint8 (N, 3, H, W) take under a quarter of the free GPU memory; estimated
    before anything is decoded, so a split too large for the GPU is never decoded for nothing."""
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    images = len(splits.train) + len(splits.val) + (len(splits.test) if splits.test is not None else 0)
    needed = images * 3 * img_size * img_size
    return needed < 0.25 * free


def decoded_cache_dir(cfg: Mapping, splits: Splits) -> Path:
    """Where the GPU loader keeps decoded splits: data.cache_dir, else `.vit-cache` in the folder holding
    train/ (or the CIFAR root) when writable, else the user's cache folder."""
    if cfg.get("cache_dir"):
        return Path(cfg["cache_dir"]).expanduser()
    if splits.root is not None and os.access(splits.root, os.W_OK):
        return splits.root / ".vit-cache"
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vit" / "decoded"


def build_data(
    cfg: Mapping, *, device: torch.device | str = "cpu", seed: int = 0, rank: int = 0, world_size: int = 1
) -> DataBundle:
    """Build the train/val loaders described by the `data` config node."""
    kind = cfg.get("loader", "auto")
    if kind not in LOADERS:
        raise DataError(f"data.loader={kind!r} must be one of {LOADERS}")
    batch_size = int(cfg.get("batch_size", 128))
    if batch_size <= 0:
        raise DataError(f"data.batch_size={batch_size} must be positive")
    img_size = int(cfg["img_size"])
    device = torch.device(device)
    splits = build_splits(cfg, seed=seed)
    num_classes = int(cfg.get("num_classes") or len(splits.class_to_idx))
    if num_classes < len(splits.class_to_idx):
        raise DataError(f"data.num_classes={num_classes} but the data has {len(splits.class_to_idx)} classes")
    mixup_fn, criterion = mixup_and_criterion(cfg, num_classes)
    mean, std = mean_std(cfg)

    # data.loader=gpu is allowed on a CPU too (tests, debugging): the same batched code runs there.
    loaders = None
    if kind == "gpu" or (kind == "auto" and device.type == "cuda"):
        loaders = _gpu_loaders(cfg, splits, device, seed, rank, world_size, batch_size, force=kind == "gpu")
    if loaders is None:
        common = dict(device=device, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
        train_loader, sampler = _torch_loader(
            Transformed(splits.train, train_transform(cfg)), cfg, train=True, **common
        )
        val_loader, _ = _torch_loader(Transformed(splits.val, val_transform(cfg)), cfg, train=False, **common)
        test_loader = None
        if splits.test is not None:
            test_loader, _ = _torch_loader(Transformed(splits.test, val_transform(cfg)), cfg, train=False, **common)
        loaders = (train_loader, val_loader, test_loader, sampler, "torch")
    train_loader, val_loader, test_loader, sampler, loader_kind = loaders
    if len(train_loader) == 0:
        raise DataError(
            f"data.batch_size={batch_size} is larger than the {len(splits.train)} training images: no full batch"
        )
    return DataBundle(
        train_loader,
        val_loader,
        num_classes,
        splits.class_to_idx,
        mixup_fn,
        criterion,
        mean,
        std,
        img_size,
        len(splits.train),
        len(splits.val),
        sampler,
        loader_kind,
        splits.val_name,
        test_loader,
        splits.test_name,
    )


def _gpu_loaders(cfg, splits, device, seed, rank, world_size, batch_size, force: bool):
    """GPU-resident loaders over decoded uint8 splits, or None when they would not fit (and not forced)."""
    img_size = int(cfg["img_size"])
    if not force and not _gpu_fits(splits, img_size, device):
        return None
    arrays = []
    parts = [(True, splits.train, splits.train_array), (False, splits.val, splits.val_array)]
    if splits.test is not None:
        parts.append((False, splits.test, splits.test_array))
    for train, dataset, array in parts:
        # CIFAR and synthetic splits are already uint8 arrays; decode (once, cached) when the size differs.
        if array is None or array[0].shape[1:3] != (img_size, img_size):
            workers = cfg.get("num_workers")
            workers = default_workers() if workers is None else int(workers)
            array = cached_split(dataset, img_size, train, decoded_cache_dir(cfg, splits), workers)
        arrays.append(array)
    common = dict(cfg=cfg, device=device, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
    train_loader, val_loader = GpuLoader(*arrays[0], train=True, **common), GpuLoader(*arrays[1], train=False, **common)
    test_loader = GpuLoader(*arrays[2], train=False, **common) if len(arrays) > 2 else None
    return train_loader, val_loader, test_loader, None, "gpu"
