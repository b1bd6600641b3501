"""A loader for datasets that fit in GPU memory: the split lives on the device as uint8, and whole batches are
augmented there, so no CPU worker sits between the GPU and its next batch.

Per epoch: the shared training permutation (vit/data/sampling.py, the torch loader's too); per batch of B images,
uint8 (B, 3, H, W) gathered on the device and handed to `BatchAugment` (vit/data/augment.py: crop, flip, policy,
normalisation, erasing), the stage the torch loader's batches go through as well.
The decoded split is cached on disk as .npy (beside the data, or in `data.cache_dir`) and reused across runs.

It also runs with device="cpu" (tests, debugging): the same ops, only slower.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from vit.data.augment import BatchAugment
from vit.data.sampling import epoch_order
from vit.data.transforms import decode_geometry, eval_resize


def decode_size(img_size: int, train: bool) -> int:
    """The shorter side images are resized to before the centre crop: val as `val_geometry`; train keeps the whole
    image (the batch crops come later)."""
    return img_size if train else eval_resize(img_size)


class _Decoded(Dataset):
    """(uint8 (H, W, 3) tensor, target) pairs of a dataset of PIL images, resized and centre-cropped.

    A module-level class (not a closure) so DataLoader workers can pickle it under any start method."""

    def __init__(self, dataset: Dataset, img_size: int, resize: int) -> None:
        self.dataset = dataset
        self.geometry = decode_geometry(img_size, resize)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, target = self.dataset[index]
        return self.geometry(image).permute(1, 2, 0), target  # (3, H, W) -> (H, W, 3)


def decode_split(dataset: Dataset, img_size: int, resize: int, num_workers: int) -> tuple[np.ndarray, np.ndarray]:
    """Decode every image once: uint8 (N, H, W, 3) and int64 (N,)."""
    loader = DataLoader(_Decoded(dataset, img_size, resize), batch_size=256, num_workers=num_workers)
    images, targets = [], []
    for x, y in loader:
        images.append(x.numpy())
        targets.append(y.numpy())
    return np.concatenate(images), np.concatenate(targets).astype(np.int64)


def split_identity(dataset: Dataset) -> list[str]:
    """What the decoded cache is keyed on: the image files (ImageFolder), or the dataset class and root
    (CIFAR), narrowed to the chosen indices for a Subset (data.limit_*_samples)."""
    if isinstance(dataset, Subset):
        base = split_identity(dataset.dataset)
        if len(base) == len(dataset.dataset):
            return [base[i] for i in dataset.indices]
        return [*base, ",".join(str(i) for i in dataset.indices)]
    samples = getattr(dataset, "samples", None)
    if samples is not None:
        return [str(path) for path, _ in samples]
    return [type(dataset).__name__, str(Path(getattr(dataset, "root", "")).resolve()), str(len(dataset))]


def cached_split(
    dataset: Dataset, img_size: int, train: bool, cache_dir: Path, num_workers: int
) -> tuple[np.ndarray, np.ndarray]:
    """`decode_split`, stored as `<split>-<size>px-r<resize>-<count>-<hash>.{images,targets}.npy` in
    `cache_dir` and loaded from there on later runs."""
    resize = decode_size(img_size, train)
    key = hashlib.sha1("|".join(split_identity(dataset)).encode()).hexdigest()[:12]
    tag = "train" if train else "val"
    stem = f"{tag}-{img_size}px-r{resize}-{len(dataset)}-{key}"
    images_path, targets_path = cache_dir / f"{stem}.images.npy", cache_dir / f"{stem}.targets.npy"
    if images_path.is_file() and targets_path.is_file():
        return np.load(images_path), np.load(targets_path)
    images, targets = decode_split(dataset, img_size, resize, num_workers)
    cache_dir.mkdir(parents=True, exist_ok=True)
    for path, array in ((images_path, images), (targets_path, targets)):
        # Write then rename: a run killed mid-write leaves no truncated file under the final name.
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        with open(tmp, "wb") as handle:
            np.save(handle, array)
        os.replace(tmp, path)
    return images, targets


class GpuLoader:
    """Iterable of (images float32 (B, 3, H, W) normalised, targets int64 (B,)) on `device`.

    Train: the epoch's permutation (from seed and epoch; `set_epoch` or one full pass advances it), every batch
    through `augment`, last partial batch dropped. Val: the images in order, only normalised, every image once.
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

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.skip = 0

    def skip_batches(self, count: int) -> None:
        """Start the next pass after its first `count` batches; the rest draw what they would have drawn."""
        self.skip = count

    def _order(self) -> torch.Tensor:
        n = len(self.targets)
        if not self.train:
            order = torch.arange(n)
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
            generator = self.augment.generator(self.device, self.seed, self.epoch, self.rank, b) if self.train else None
            yield self.augment(self.images[idx], generator), self.targets[idx]
        if self.train:
            self.epoch += 1
