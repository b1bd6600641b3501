"""`build_data(cfg.data)`: datasets, transforms and loaders assembled into one `DataBundle`.

Two loaders, one augmentation. The torch loader decodes and crops in CPU workers and hands uint8 batches to the
device; the GPU-resident loader keeps the decoded split on the device. Either way a batch then goes through the
same `BatchAugment` (vit/data/augment/batch.py) on the device, so a config means the same augmented images on both.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from vit.data.augment.batch import AugmentSpec, BatchAugment
from vit.data.augment.transforms import mean_std, mixup_and_criterion, train_geometry, val_geometry
from vit.data.declared import complete
from vit.data.loading.decoded_cache import cached_split
from vit.data.loading.gpu_loader import GpuLoader
from vit.data.loading.sampling import epoch_order, evaluation_order
from vit.data.resources import available_memory, cache_folder, num_workers
from vit.data.sources.datasets import DataError, Splits, build_splits, targets_of

log = logging.getLogger(__name__)

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
    loader_reason: str = ""  # why this loader (data.loader=auto decides by device and memory)
    val_name: str = "val"  # "holdout" with data.holdout, else the split's own name
    test_loader: Iterable | None = None  # with data.holdout: the split the holdout replaced, for the final report
    test_name: str | None = None
    train_workers: int = 0  # the train loader's worker processes (0: it runs in the training process)


class Transformed(Dataset):
    """Apply a transform to the (PIL image, target) pairs of another dataset."""

    def __init__(self, dataset: Dataset, transform: Callable) -> None:
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, target = self.dataset[index]
        return self.transform(image), target


def _init_worker(worker_id: int) -> None:
    """In each loader worker: numpy/random seeded from torch's per-worker seed (reproducible augmentation), and a
    process group of its own. Ctrl-C, `timeout` or a scheduler signal the run's whole process group; the trainer
    then finishes its step, writes last.pt and shuts its workers down itself, where a worker killed by that signal
    first would take the run down with a traceback. Outside the group, rather than ignoring the signals, a worker
    still stops when it is asked directly: by its DataLoader, or by Python's exit (which would wait forever for a
    worker that ignored SIGTERM)."""
    import random
    import signal

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

    def __iter__(self):
        order = epoch_order(len(self.dataset), self.seed, self.epoch, self.repeats)
        indices = order[: self.total_size][self.rank : self.total_size : self.num_replicas].tolist()
        return iter(indices[self.skip :])

    def __len__(self) -> int:
        return max(0, self.num_samples - self.skip)


def _torch_loader(dataset, cfg, *, train, device, seed, rank, world_size, batch_size):
    workers = num_workers(cfg)
    if train:
        # Also with one process: the permutation is then the same for every world size, and global batch k
        # (rank r takes every world_size-th index) holds the same images whether 1 or N processes train.
        sampler = EpochSampler(dataset, world_size, rank, seed, repeats=int(cfg.get("repeated_aug") or 1))
    else:
        sampler = ShardSampler(len(dataset), rank, world_size, order=class_balanced_order(dataset))
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=train,
        num_workers=workers,
        pin_memory=bool(cfg.pin_memory) and torch.device(device).type == "cuda",
        persistent_workers=workers > 0,
        worker_init_fn=_init_worker,
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
        for index, (images, targets) in enumerate(self.loader, start):
            images = images.to(self.device, non_blocking=True)
            targets = targets.to(self.device, non_blocking=True)
            generator = (
                self.augment.generator(self.device, self.seed, self.epoch, self.rank, index) if self.train else None
            )
            yield self.augment(images, generator), targets
        if self.train:  # as the GPU-resident loader: a full pass moves on to the next epoch
            self.epoch += 1
            self.sampler.set_epoch(self.epoch)


def _in_memory_fits(splits: Splits, img_size: int, device: torch.device) -> tuple[bool, str]:
    """Whether the splits as uint8 (N, 3, H, W) take under a quarter of the free memory of the device they would
    live on (the GPU's, or the host's for a CPU run), and the reason in words; estimated before anything is
    decoded, so a split too large is never decoded for nothing. On a CPU the in-memory path pays most: the torch
    loader's workers would decode every JPEG again each epoch on the same cores the step needs (measured in
    docs/BENCHMARKS.md, "The CPU loader and thread defaults")."""
    if device.type == "cuda":
        free, where = torch.cuda.mem_get_info(device)[0], str(device)
    elif device.type == "cpu":
        free, where = available_memory(), "this machine's memory"
    else:
        return False, f"the device is {device.type}"
    images = len(splits.train) + len(splits.val) + (len(splits.test) if splits.test is not None else 0)
    needed = images * 3 * img_size * img_size
    verdict = "under" if needed < 0.25 * free else "over"
    return needed < 0.25 * free, (
        f"the device is {device.type}; {images} images at {img_size} px take {needed / 2**30:.2f} GiB, {verdict} a "
        f"quarter of the {free / 2**30:.1f} GiB free in {where}"
    )


def decoded_cache_dir(cfg: Mapping, splits: Splits) -> Path:
    """Where the GPU loader keeps decoded splits (vit/data/resources.py's rule, beside the folder holding train/
    or the CIFAR root)."""
    return cache_folder(cfg, splits.root, "decoded")


def choose_loader(cfg: Mapping, splits: Splits, device: torch.device) -> tuple[str, str]:
    """("torch" or "gpu", why): data.loader=gpu|torch as asked; auto: the decoded in-memory loader (the
    GPU-resident loader's code, on the training device) when the decoded splits fit (`_in_memory_fits`), on CUDA
    and on a CPU alike, else the torch loader."""
    kind = cfg.loader
    if kind != "auto":
        return kind, f"data.loader={kind}"
    fits, why = _in_memory_fits(splits, int(cfg["img_size"]), device)
    return ("gpu" if fits else "torch"), f"data.loader=auto: {why}"


def build_data(
    cfg: Mapping, *, device: torch.device | str = "cpu", seed: int = 0, rank: int = 0, world_size: int = 1
) -> DataBundle:
    """Build the train/val loaders described by the `data` config node."""
    cfg = complete(cfg)  # a hand-built config's missing keys: as configs/data/<name>.yaml declares them
    batch_size = int(cfg.batch_size)
    if batch_size <= 0:
        raise DataError(f"data.batch_size={batch_size} must be positive")
    spec = AugmentSpec.from_config(cfg.get("augment"))
    img_size = int(cfg["img_size"])
    device = torch.device(device)
    if cfg.loader not in LOADERS:
        raise DataError(f"data.loader={cfg.get('loader')!r} must be one of {LOADERS}")
    if cfg.get("name") == "webdataset":  # tar shards, streamed: no splits to hold in memory (stream.py)
        from vit.data.loading.stream import build_stream_data  # imports this module: loaded only when asked for

        mean, std = mean_std(cfg)
        common = dict(device=device, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
        return build_stream_data(cfg, spec, mean, std, **common)
    splits = build_splits(cfg, seed=seed)
    num_classes = int(cfg.get("num_classes") or len(splits.class_to_idx))
    if num_classes < len(splits.class_to_idx):
        raise DataError(f"data.num_classes={num_classes} but the data has {len(splits.class_to_idx)} classes")
    mixup_fn, criterion = mixup_and_criterion(spec, num_classes)
    mean, std = mean_std(cfg)
    kind, reason = choose_loader(cfg, splits, device)
    log.info("loader: %s (%s)", kind, reason)
    # data.loader=gpu is allowed on a CPU too (tests, debugging): the same batched code runs there.
    common = dict(device=device, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
    build = _gpu_loaders if kind == "gpu" else _torch_loaders
    train_loader, val_loader, test_loader, sampler = build(cfg, splits, spec, mean, std, **common)
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
        kind,
        reason,
        splits.val_name,
        test_loader,
        splits.test_name,
        train_workers=num_workers(cfg) if kind == "torch" else 0,
    )


def _torch_loaders(cfg, splits, spec, mean, std, *, device, seed, rank, world_size, batch_size):
    """DataLoaders over the files (workers decode and, for crop=rrc, crop), each wrapped in `DeviceBatches`."""
    img_size = int(cfg["img_size"])
    common = dict(device=device, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
    train_aug = BatchAugment(spec, mean, std, img_size, train=True, crop_done=True)
    val_aug = BatchAugment(spec, mean, std, img_size, train=False)
    train, sampler = _torch_loader(Transformed(splits.train, train_geometry(cfg, spec)), cfg, train=True, **common)
    wrap = dict(device=device, seed=seed, rank=rank)
    loaders = [DeviceBatches(train, sampler, train_aug, **wrap)]
    for split in (splits.val, splits.test):
        if split is None:
            loaders.append(None)
            continue
        loader, shards = _torch_loader(Transformed(split, val_geometry(cfg)), cfg, train=False, **common)
        loaders.append(DeviceBatches(loader, shards, val_aug, **wrap))
    return *loaders, sampler


def _gpu_loaders(cfg, splits, spec, mean, std, *, device, seed, rank, world_size, batch_size):
    """GPU-resident loaders over decoded uint8 splits."""
    img_size = int(cfg["img_size"])
    arrays = []
    parts = [(True, splits.train, splits.train_array), (False, splits.val, splits.val_array)]
    if splits.test is not None:
        parts.append((False, splits.test, splits.test_array))
    for train, dataset, array in parts:
        # CIFAR and synthetic splits are already uint8 arrays; decode (once, cached) when the size differs.
        if array is None or array[0].shape[1:3] != (img_size, img_size):
            array = cached_split(dataset, img_size, train, decoded_cache_dir(cfg, splits), num_workers(cfg))
        arrays.append(array)
    common = dict(device=device, seed=seed, rank=rank, world_size=world_size, batch_size=batch_size)
    train_aug = BatchAugment(spec, mean, std, img_size, train=True)
    val_aug = BatchAugment(spec, mean, std, img_size, train=False)
    repeats = int(cfg.get("repeated_aug") or 1)
    train_loader = GpuLoader(*arrays[0], train_aug, train=True, repeats=repeats, **common)
    val_loader = GpuLoader(*arrays[1], val_aug, train=False, **common)
    test_loader = GpuLoader(*arrays[2], val_aug, train=False, **common) if len(arrays) > 2 else None
    return train_loader, val_loader, test_loader, None
